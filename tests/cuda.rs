//! typed-amp's CUDA kernels against the CPU implementation, and a short mixed-precision training
//! run on both devices.
//!
//! Every test first opens GPU 0 and, where that fails, prints why and passes: these tests build
//! everywhere with `--features cuda` but run only where a GPU is. (A test binary linked against a
//! `libcuda` that the machine lacks cannot start at all; that is the loader's doing, not theirs.)
//!
//! The kernels are the device capabilities of `typed_amp::device` ([`CastKernel`],
//! [`UnscaleKernel`], [`ReduceKernel`], [`FillKernel`], [`HostKernel`], [`StatsDevice`]), each
//! generic over element types; the tests that sweep precisions run once per precision (or per
//! ordered pair of precisions) of `typed_amp::with_precisions!`, so that a precision added to the
//! list is tested here without a change.
#![cfg(feature = "cuda")]

use std::marker::PhantomData;
use std::panic::catch_unwind;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;
use typed_amp::device::{
    AmpDevice, CastKernel, FillKernel, HostKernel, Kernels, ReduceKernel, StatsDevice,
    UnscaleKernel,
};
use typed_amp::dfdx::nn::ToDevice;
use typed_amp::dfdx::optim::Sgd;
use typed_amp::loss::cross_entropy_with_logits_loss;
use typed_amp::precision::AmpElem;
use typed_amp::precision::{dtype_of, DType};
use typed_amp::prelude::*;

/// Opens GPU 0, or says why not and returns `None`. cudarc panics, rather than erring, when the
/// driver or the device is missing, so panics count as "no device" too.
fn open_cuda(seed: u64) -> Option<Cuda> {
    match catch_unwind(|| Cuda::try_build(0, seed)) {
        Ok(Ok(dev)) => Some(dev),
        Ok(Err(err)) => {
            println!("skipping: no CUDA device ({err})");
            None
        }
        Err(panic) => {
            let why = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("opening it panicked");
            println!("skipping: no CUDA device ({why})");
            None
        }
    }
}

macro_rules! cuda_or_skip {
    ($seed:expr) => {
        match open_cuda($seed) {
            Some(dev) => dev,
            None => return,
        }
    };
}

/// Threads per block times the most blocks the kernels launch: one pass of the largest grid.
const GRID_PASS: usize = 256 * 2048;

/// Longer than two passes of the largest grid, so that every grid-stride loop goes round more
/// than once and ends part-way through a pass.
const LONG: usize = 2 * GRID_PASS + 7;

// ---------------------------------------------------------------------------------------------
// Precisions: every one of `typed_amp::with_precisions!`, and every ordered pair of them.

/// A test body run once per precision, `E` being its element type.
trait PerPrecision {
    fn run<E: AmpElem>(&mut self)
    where
        Cpu: Kernels<E>,
        Cuda: Kernels<E>;
}

/// A test body run once per ordered pair of precisions, from `S` to `D`.
trait PerPair {
    fn run<S: AmpElem, D: AmpElem>(&mut self)
    where
        Cpu: Kernels<S> + Kernels<D> + CastKernel<S, D>,
        Cuda: Kernels<S> + Kernels<D> + CastKernel<S, D>;
}

/// Generates `for_each_precision` and `for_each_pair` from the list of precisions.
macro_rules! precision_loops {
    ($([$marker:ident, $elem:ty, $variant:ident, $name:literal, $st:ident, $index:literal])*) => {
        precision_loops!(@loops [$($elem),*] [$($elem),*]);
    };
    (@loops $all:tt [$($elem:ty),*]) => {
        /// Runs `body` for every precision, in the list's order.
        fn for_each_precision(body: &mut impl PerPrecision) {
            $(body.run::<$elem>();)*
        }

        /// Runs `body` for every ordered pair of precisions (a precision with itself included).
        fn for_each_pair(body: &mut impl PerPair) {
            $(precision_loops!(@row body, $elem, $all);)*
        }
    };
    (@row $body:ident, $src:ty, [$($dst:ty),*]) => {
        $($body.run::<$src, $dst>();)*
    };
}

typed_amp::with_precisions!(precision_loops);

// ---------------------------------------------------------------------------------------------
// Buffers and kernels.

/// A device buffer of element type `E`.
struct Buf<D: Storage<E>, E: AmpElem> {
    vec: <D as Storage<E>>::Vec,
    elem: PhantomData<E>,
}

impl<D: Kernels<E>, E: AmpElem> Buf<D, E> {
    /// A buffer of `values`, rounded to `E` on the host (so every device gets the same bits).
    fn new(dev: &D, values: &[f32]) -> Self {
        let t: Tensor<(usize,), E, D> = dev.tensor_from_vec(round(values), (values.len(),));
        Self {
            vec: t.storage().clone(),
            elem: PhantomData,
        }
    }

    /// The buffer's values, copied to the host exactly and widened to FP32 (exactly too).
    fn read(&self, dev: &D) -> Vec<f32> {
        let values = HostKernel::<E>::try_read(dev, &self.vec).unwrap();
        values.into_iter().map(AmpElem::to_f32).collect()
    }
}

/// `values` rounded to `E` (nearest-even, overflowing to ±inf) on the host.
fn round<E: AmpElem>(values: &[f32]) -> Vec<E> {
    values
        .iter()
        .map(|x| <E as AmpElem>::from_f32(*x))
        .collect()
}

/// Sets `stats[slot]` to 1 through a flagged unscale, so that a test can see whether the next
/// kernel into that slot starts from zero, as slots reused from step to step must.
fn dirty_slot<D: AmpDevice>(dev: &D, stats: &mut D::Stats, slot: usize) {
    let inf = Buf::<D, f32>::new(dev, &[f32::INFINITY]);
    let mut out = Buf::<D, f32>::new(dev, &[0.0]);
    UnscaleKernel::<f32>::try_unscale_to_f32(dev, &inf.vec, &mut out.vec, 1.0, stats, slot)
        .unwrap();
    assert_eq!(dev.try_read_stats(stats).unwrap()[slot], 1.0);
}

/// Every kernel, with its scalar argument.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// `HostKernel::try_write` of the source values, rounded to the destination's precision on
    /// the host, into the destination.
    Write,
    AddCast,
    CopyCast,
    /// `UnscaleKernel::try_unscale_to_f32`: into FP32 destinations only.
    Unscale(f32),
    UnscaleInPlace(f32),
    Fill(f32),
    Scale(f32),
    Clamp(f32),
    SumSquares,
    MaxAbs,
}

impl Op {
    /// Whether the op has a kernel with a destination of element type `D`: working gradients
    /// are unscaled into FP32 master gradients only.
    fn has_destination<D: AmpElem>(self) -> bool {
        !matches!(self, Op::Unscale(_)) || dtype_of::<D>() == DType::F32
    }
}

/// Runs `op` on `dev` from a source of element type `S` holding `src` into a destination of
/// element type `D` holding `dst` (in-place ops work on the destination, reductions read the
/// source), with its stats slot dirtied first. Returns the destination and the slot.
fn run_on<Dev, S, D>(dev: &Dev, op: Op, src: &[f32], dst: &[f32]) -> (Vec<f32>, f32)
where
    Dev: AmpDevice + Kernels<S> + Kernels<D> + CastKernel<S, D>,
    S: AmpElem,
    D: AmpElem,
{
    assert!(op.has_destination::<D>(), "{op:?} into {}", dtype_of::<D>());
    let source = Buf::<Dev, S>::new(dev, src);
    let mut target = Buf::<Dev, D>::new(dev, dst);
    // Where the op writes an FP32 buffer of its own (`D` is `f32` then: it holds `dst` too).
    let mut unscaled = None;
    let mut stats = dev.try_alloc_stats(2).unwrap();
    dirty_slot(dev, &mut stats, 1);
    let (s, d) = (&source.vec, &mut target.vec);
    match op {
        Op::Write => HostKernel::<D>::try_write(dev, d, &round::<D>(src)),
        Op::AddCast => CastKernel::<S, D>::try_add_cast(dev, s, d),
        Op::CopyCast => CastKernel::<S, D>::try_copy_cast(dev, s, d),
        Op::Unscale(inv) => {
            let out = unscaled.insert(Buf::<Dev, f32>::new(dev, dst));
            UnscaleKernel::<S>::try_unscale_to_f32(dev, s, &mut out.vec, inv, &mut stats, 1)
        }
        Op::UnscaleInPlace(inv) => {
            UnscaleKernel::<D>::try_unscale_in_place(dev, d, inv, &mut stats, 1)
        }
        Op::Fill(value) => FillKernel::<D>::try_fill(dev, d, value),
        Op::Scale(factor) => FillKernel::<D>::try_scale(dev, d, factor),
        Op::Clamp(limit) => FillKernel::<D>::try_clamp(dev, d, limit),
        Op::SumSquares => ReduceKernel::<S>::try_sum_squares(dev, s, &mut stats, 1),
        Op::MaxAbs => ReduceKernel::<S>::try_max_abs(dev, s, &mut stats, 1),
    }
    .unwrap();
    let stats = dev.try_read_stats(&stats).unwrap();
    assert_eq!(stats[0], 0.0, "{op:?} wrote outside its slot");
    let result = match unscaled {
        Some(out) => out.read(dev),
        None => target.read(dev),
    };
    (result, stats[1])
}

/// Bit patterns with every NaN made one NaN: devices differ in the payloads they produce.
fn bits(x: f32) -> u32 {
    if x.is_nan() {
        f32::NAN.to_bits()
    } else {
        x.to_bits()
    }
}

fn assert_same_bits(cpu: &[f32], gpu: &[f32], what: &str) {
    assert_eq!(cpu.len(), gpu.len(), "{what}: lengths differ");
    if let Some(i) = (0..cpu.len()).find(|&i| bits(cpu[i]) != bits(gpu[i])) {
        panic!(
            "{what}: element {i} is {:e} ({:#010x}) on the CPU but {:e} ({:#010x}) on CUDA",
            cpu[i],
            cpu[i].to_bits(),
            gpu[i],
            gpu[i].to_bits()
        );
    }
}

/// Finite values chosen to hit FP16's edges (its largest value, the first value that rounds to
/// inf, ties, subnormals, FP32 subnormals and values far outside FP16's range), then random
/// values over 47 binades.
fn awkward_values(n: usize, seed: u64) -> Vec<f32> {
    let special = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        65504.0,
        65519.0,
        65520.0,
        -65520.0,
        1.0 + 2f32.powi(-11),
        1.0 + 3.0 * 2f32.powi(-11),
        6.0e-8,
        -3.0e-8,
        2f32.powi(-25),
        1.0e-45,
        -1.0e-40,
        1.0e30,
        f32::MAX,
        f32::MIN_POSITIVE,
    ];
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|i| match special.get(i) {
            Some(x) => *x,
            None => rng.sample::<f32, _>(StandardNormal) * 2f32.powi(rng.gen_range(-30..17)),
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The kernels.

/// The ops, over sources and destinations of one pair of precisions, on both devices.
struct EveryKernel {
    gpu: Cuda,
    cpu: Cpu,
    ops: Vec<Op>,
    sources: [Vec<f32>; 2],
    destinations: [Vec<f32>; 2],
    compared: usize,
}

impl PerPair for EveryKernel {
    fn run<S: AmpElem, D: AmpElem>(&mut self)
    where
        Cpu: Kernels<S> + Kernels<D> + CastKernel<S, D>,
        Cuda: Kernels<S> + Kernels<D> + CastKernel<S, D>,
    {
        for &op in self.ops.iter().filter(|op| op.has_destination::<D>()) {
            for src in &self.sources {
                for dst in &self.destinations {
                    let what = format!("{op:?} {} -> {}", dtype_of::<S>(), dtype_of::<D>());
                    let (c, c_slot) = run_on::<Cpu, S, D>(&self.cpu, op, src, dst);
                    let (g, g_slot) = run_on::<Cuda, S, D>(&self.gpu, op, src, dst);
                    assert_same_bits(&c, &g, &what);
                    assert_eq!(bits(c_slot), bits(g_slot), "{what}: stats slot");
                    self.compared += 1;
                }
            }
        }
    }
}

#[test]
fn every_kernel_matches_the_cpu_bit_for_bit_in_every_precision() {
    let gpu = cuda_or_skip!(0);
    let n = 3 * 256 + 5;
    let plain = awkward_values(n, 1);
    let other = awkward_values(n, 2);
    let mut with_specials = awkward_values(n, 3);
    with_specials[n / 2] = f32::NAN;
    with_specials[n - 1] = f32::NEG_INFINITY;
    let ops = vec![
        Op::Write,
        Op::AddCast,
        Op::CopyCast,
        Op::Unscale(2f32.powi(-16)),
        Op::Unscale(0.1),
        // Scaling up: f32::MAX × 3 overflows the FP32 destination, and in place FP16 values
        // from 21840 up overflow FP16. The flag is computed on the result as stored (after the
        // division and the rounding), so those slots are set although the input was finite;
        // before the flag moved to the result, they were not. Either way the devices agree.
        Op::Unscale(3.0),
        Op::UnscaleInPlace(0.1),
        Op::UnscaleInPlace(3.0),
        Op::Fill(0.1),
        Op::Fill(-0.0),
        Op::Fill(0.0),
        Op::Fill(65520.0),
        Op::Scale(0.37),
        Op::Scale(1.0e6),
        Op::Clamp(1.5),
        Op::Clamp(0.0),
        Op::MaxAbs,
    ];
    let mut every = EveryKernel {
        gpu,
        cpu: Cpu::default(),
        ops,
        sources: [plain.clone(), with_specials.clone()],
        destinations: [other, with_specials],
        compared: 0,
    };
    for_each_pair(&mut every);
    // Every op in every pair with both sources and both destinations, bar unscaling into a
    // destination that is not FP32.
    let p = DType::ALL.len();
    let unscales = every
        .ops
        .iter()
        .filter(|op| matches!(op, Op::Unscale(_)))
        .count();
    assert_eq!(
        every.compared,
        4 * (every.ops.len() * p * p - unscales * p * (p - 1))
    );

    // The flag of a scaled-up unscale reflects the result: f32::MAX (a finite input) × 3 is inf.
    let (out, flag) = run_on::<Cuda, f32, f32>(&every.gpu, Op::Unscale(3.0), &plain, &plain);
    assert!(out[16].is_infinite() && flag == 1.0);
}

/// Σx² per precision, against a sum by hand in FP64, on both devices.
struct SumOfSquares {
    gpu: Cuda,
    cpu: Cpu,
    values: Vec<f32>,
}

impl PerPrecision for SumOfSquares {
    fn run<E: AmpElem>(&mut self)
    where
        Cpu: Kernels<E>,
        Cuda: Kernels<E>,
    {
        let by_hand: f64 = round::<E>(&self.values)
            .into_iter()
            .map(|x| f64::from(x.to_f32()))
            .map(|x| x * x)
            .sum();
        let values = &self.values;
        let (_, c) = run_on::<Cpu, E, f32>(&self.cpu, Op::SumSquares, values, &[]);
        let (_, g) = run_on::<Cuda, E, f32>(&self.gpu, Op::SumSquares, values, &[]);
        // Both accumulate in FP32, in different orders. Every term is non-negative, so there is
        // no cancellation: the worst case for 100,003 terms added one by one is n·2^-24 ≈ 6e-3,
        // but the CPU's eight lanes and the GPU's tree keep the chains short and the errors of
        // random rounding grow like √n, so 1e-4 is a statistical bound, not a worst case. A
        // lost block of the GPU's grid would lose 1/391 of the sum, 25 times more.
        let prec = dtype_of::<E>();
        for (who, got) in [("CPU", c), ("CUDA", g)] {
            let err = (f64::from(got) - by_hand).abs() / by_hand;
            assert!(err < 1e-4, "{prec} on {who}: {got} vs {by_hand}");
        }
    }
}

#[test]
fn sum_of_squares_agrees_with_the_cpu_to_rounding() {
    let gpu = cuda_or_skip!(0);
    // Moderate magnitudes (no FP16 overflow), so that this measures accuracy only.
    let mut rng = StdRng::seed_from_u64(4);
    let values: Vec<f32> = (0..100_003)
        .map(|_| rng.sample::<f32, _>(StandardNormal) * 2f32.powi(rng.gen_range(-4..5)))
        .collect();
    for_each_precision(&mut SumOfSquares {
        gpu,
        cpu: Cpu::default(),
        values,
    });
}

#[test]
fn unscale_flags_non_finite_in_either_precision_across_blocks() {
    let dev = cuda_or_skip!(0);
    let mut values = vec![2.0f32; LONG];
    let mut stats = dev.try_alloc_stats(3).unwrap();
    let mut dst = Buf::<Cuda, f32>::new(&dev, &values);

    let src = Buf::<Cuda, f32>::new(&dev, &values);
    UnscaleKernel::<f32>::try_unscale_to_f32(&dev, &src.vec, &mut dst.vec, 0.25, &mut stats, 0)
        .unwrap();
    assert!(dst.read(&dev).iter().all(|x| *x == 0.5));

    // A single inf in the grid's last partial pass.
    *values.last_mut().unwrap() = f32::INFINITY;
    let src = Buf::<Cuda, f16>::new(&dev, &values);
    UnscaleKernel::<f16>::try_unscale_to_f32(&dev, &src.vec, &mut dst.vec, 0.25, &mut stats, 1)
        .unwrap();
    assert!(dst.read(&dev).last().unwrap().is_infinite());

    values[GRID_PASS + 1] = f32::NAN;
    let mut src = Buf::<Cuda, f16>::new(&dev, &values);
    UnscaleKernel::<f16>::try_unscale_in_place(&dev, &mut src.vec, 0.5, &mut stats, 2).unwrap();
    assert_eq!(src.read(&dev)[0], 1.0);
    assert_eq!(dev.try_read_stats(&stats).unwrap(), vec![0.0, 1.0, 1.0]);

    // Slots are reused from step to step: a clean buffer clears what an earlier step set, and a
    // bad one sets a slot that was clear, whatever the precisions. (Unscaling writes FP32 only,
    // so where this once unscaled FP16 into FP16 it now unscales FP16 into FP32.)
    let clean = vec![2.0f32; LONG];
    let mut bad = clean.clone();
    bad[3] = f32::NEG_INFINITY;
    let half_clean = Buf::<Cuda, f16>::new(&dev, &clean);
    UnscaleKernel::<f16>::try_unscale_to_f32(
        &dev,
        &half_clean.vec,
        &mut dst.vec,
        0.25,
        &mut stats,
        1,
    )
    .unwrap();
    let mut f32_clean = Buf::<Cuda, f32>::new(&dev, &clean);
    UnscaleKernel::<f32>::try_unscale_in_place(&dev, &mut f32_clean.vec, 0.5, &mut stats, 2)
        .unwrap();
    let f32_bad = Buf::<Cuda, f32>::new(&dev, &bad);
    UnscaleKernel::<f32>::try_unscale_to_f32(&dev, &f32_bad.vec, &mut dst.vec, 0.25, &mut stats, 0)
        .unwrap();
    assert_eq!(dev.try_read_stats(&stats).unwrap(), vec![1.0, 0.0, 0.0]);
    assert_eq!(dst.read(&dev)[3], f32::NEG_INFINITY);
    assert_eq!(dst.read(&dev)[4], 0.5);

    // The flag is computed on the result as stored, after the division and the rounding, not
    // on the input: a finite FP16 value scaled up past 65504 in place, a finite FP32 value past
    // f32::MAX, and zeros times the infinite reciprocal of a scale below 2^-126 (NaN) are all
    // flagged, though no input held inf or NaN.
    let mut stats = dev.try_alloc_stats(3).unwrap();
    let mut half = Buf::<Cuda, f16>::new(&dev, &[60000.0, 1.0]);
    UnscaleKernel::<f16>::try_unscale_in_place(&dev, &mut half.vec, 2.0, &mut stats, 0).unwrap();
    assert_eq!(half.read(&dev), vec![f32::INFINITY, 2.0]);
    let big = Buf::<Cuda, f32>::new(&dev, &[f32::MAX, 1.0]);
    let mut out = Buf::<Cuda, f32>::new(&dev, &[0.0, 0.0]);
    UnscaleKernel::<f32>::try_unscale_to_f32(&dev, &big.vec, &mut out.vec, 2.0, &mut stats, 1)
        .unwrap();
    assert_eq!(out.read(&dev), vec![f32::INFINITY, 2.0]);
    let inv = (1.0f64 / f64::from(f32::from_bits(1))) as f32;
    assert!(inv.is_infinite());
    let zeros = Buf::<Cuda, f16>::new(&dev, &[0.0, 0.0]);
    UnscaleKernel::<f16>::try_unscale_to_f32(&dev, &zeros.vec, &mut out.vec, inv, &mut stats, 2)
        .unwrap();
    assert!(out.read(&dev).iter().all(|x| x.is_nan()));
    assert_eq!(dev.try_read_stats(&stats).unwrap(), vec![1.0, 1.0, 1.0]);
}

#[test]
fn casts_round_trip_accumulate_and_overflow_like_hardware() {
    let dev = cuda_or_skip!(0);
    let n = GRID_PASS + 3;
    let values: Vec<f32> = (0..n).map(|i| (i % 4096) as f32 * 0.5).collect();
    let src = Buf::<Cuda, f32>::new(&dev, &values);
    let mut half = Buf::<Cuda, f16>::new(&dev, &vec![1.0; n]);
    CastKernel::<f32, f16>::try_add_cast(&dev, &src.vec, &mut half.vec).unwrap();
    let got = half.read(&dev);
    assert_eq!(got[10], 6.0);
    assert_eq!(got[n - 1], 1.0 + ((n - 1) % 4096) as f32 * 0.5);
    let mut back = Buf::<Cuda, f32>::new(&dev, &vec![0.0; n]);
    CastKernel::<f16, f32>::try_copy_cast(&dev, &half.vec, &mut back.vec).unwrap();
    assert_eq!(back.read(&dev), got);

    // 65504 is FP16's largest finite value and 65520 the first that rounds to inf; 1 + 2^-11 is
    // a tie between 1 and 1 + 2^-10 and rounds to even (1).
    let edges = [
        65504.0,
        65519.0,
        65520.0,
        -65520.0,
        1.0 + 2f32.powi(-11),
        f32::NAN,
    ];
    let src = Buf::<Cuda, f32>::new(&dev, &edges);
    let mut half = Buf::<Cuda, f16>::new(&dev, &[0.0; 6]);
    CastKernel::<f32, f16>::try_copy_cast(&dev, &src.vec, &mut half.vec).unwrap();
    let got = half.read(&dev);
    assert_eq!(
        &got[..5],
        &[65504.0, 65504.0, f32::INFINITY, f32::NEG_INFINITY, 1.0]
    );
    assert!(got[5].is_nan());

    let short = Buf::<Cuda, f32>::new(&dev, &[1.0]);
    assert!(CastKernel::<f32, f32>::try_copy_cast(&dev, &short.vec, &mut back.vec).is_err());
    assert!(CastKernel::<f32, f32>::try_add_cast(&dev, &short.vec, &mut back.vec).is_err());
    let mut short_half = Buf::<Cuda, f16>::new(&dev, &[1.0]);
    assert!(CastKernel::<f32, f16>::try_copy_cast(&dev, &src.vec, &mut short_half.vec).is_err());
}

#[test]
fn bad_arguments_are_errors_that_touch_nothing() {
    let dev = cuda_or_skip!(0);
    let mut stats = dev.try_alloc_stats(2).unwrap();
    dirty_slot(&dev, &mut stats, 0);
    let src = Buf::<Cuda, f16>::new(&dev, &[f32::INFINITY, 1.0, 2.0]);
    let mut dst = Buf::<Cuda, f32>::new(&dev, &[7.0, 7.0]);
    let unscale = UnscaleKernel::<f16>::try_unscale_to_f32;
    assert!(unscale(&dev, &src.vec, &mut dst.vec, 0.5, &mut stats, 0).is_err());
    assert!(unscale(&dev, &src.vec, &mut dst.vec, 0.5, &mut stats, 1).is_err());
    // A slot past the end is an error, not a write out of bounds.
    let mut fits = Buf::<Cuda, f32>::new(&dev, &[7.0, 7.0, 7.0]);
    assert!(unscale(&dev, &src.vec, &mut fits.vec, 0.5, &mut stats, 2).is_err());
    assert!(
        UnscaleKernel::<f32>::try_unscale_in_place(&dev, &mut fits.vec, 0.5, &mut stats, 2)
            .is_err()
    );
    assert!(ReduceKernel::<f16>::try_sum_squares(&dev, &src.vec, &mut stats, 2).is_err());
    assert!(HostKernel::<f32>::try_write(&dev, &mut dst.vec, &[1.0, 2.0, 3.0]).is_err());
    assert!(ReduceKernel::<f16>::try_max_abs(&dev, &src.vec, &mut stats, 2).is_err());
    assert_eq!(dev.try_read_stats(&stats).unwrap(), vec![1.0, 0.0]);
    assert_eq!(dst.read(&dev), vec![7.0, 7.0]);
    assert_eq!(fits.read(&dev), vec![7.0, 7.0, 7.0]);
}

/// Σx² and max|x| of one precision across many blocks, through inf and NaN, into slots that
/// earlier results (of this precision or another) were left in.
struct LongReductions {
    dev: Cuda,
    stats: <Cuda as StatsDevice>::Stats,
}

impl PerPrecision for LongReductions {
    fn run<E: AmpElem>(&mut self)
    where
        Cpu: Kernels<E>,
        Cuda: Kernels<E>,
    {
        let (dev, stats, prec) = (&self.dev, &mut self.stats, dtype_of::<E>());
        let reduce = |stats: &mut <Cuda as StatsDevice>::Stats, buf: &Buf<Cuda, E>| {
            ReduceKernel::<E>::try_sum_squares(dev, &buf.vec, stats, 0).unwrap();
            ReduceKernel::<E>::try_max_abs(dev, &buf.vec, stats, 1).unwrap();
            dev.try_read_stats(stats).unwrap()
        };
        // Small integers square and add exactly in FP32 in any order (every partial sum is an
        // integer below 2^24), so the result is exact.
        let mut long: Vec<f32> = (0..LONG).map(|i| (i % 7) as f32 - 3.0).collect();
        let exact: u64 = (0..LONG).map(|i| ((i % 7) as i64 - 3).pow(2) as u64).sum();
        assert!(exact < 1 << 24);
        let buf = Buf::<Cuda, E>::new(dev, &long);
        assert_eq!(reduce(stats, &buf), vec![exact as f32, 3.0], "{prec}");

        // The largest magnitude in the last partial pass, then inf, then NaN over inf.
        long[LONG - 1] = -7.5;
        let buf = Buf::<Cuda, E>::new(dev, &long);
        ReduceKernel::<E>::try_max_abs(dev, &buf.vec, stats, 1).unwrap();
        assert_eq!(dev.try_read_stats(stats).unwrap()[1], 7.5, "{prec}");
        long[GRID_PASS] = f32::NEG_INFINITY;
        let buf = Buf::<Cuda, E>::new(dev, &long);
        assert_eq!(
            reduce(stats, &buf),
            vec![f32::INFINITY, f32::INFINITY],
            "{prec}"
        );
        long[5] = f32::NAN;
        let buf = Buf::<Cuda, E>::new(dev, &long);
        let read = reduce(stats, &buf);
        assert!(read[0].is_nan() && read[1].is_nan(), "{prec}: {read:?}");
    }
}

#[test]
fn reductions_for_clipping() {
    let dev = cuda_or_skip!(0);
    let mut stats = dev.try_alloc_stats(2).unwrap();
    let values = [3.0, -4.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 12.0];
    let mut buf = Buf::<Cuda, f32>::new(&dev, &values);
    for _ in 0..2 {
        // Twice into the same slots: each result starts from zero.
        ReduceKernel::<f32>::try_sum_squares(&dev, &buf.vec, &mut stats, 0).unwrap();
        ReduceKernel::<f32>::try_max_abs(&dev, &buf.vec, &mut stats, 1).unwrap();
        assert_eq!(dev.try_read_stats(&stats).unwrap(), vec![169.0, 12.0]);
    }
    FillKernel::<f32>::try_clamp(&dev, &mut buf.vec, 3.5).unwrap();
    assert_eq!(&buf.read(&dev)[..2], &[3.0, -3.5]);
    FillKernel::<f32>::try_scale(&dev, &mut buf.vec, 2.0).unwrap();
    assert_eq!(buf.read(&dev)[8], 7.0);
    let mut half = Buf::<Cuda, f16>::new(&dev, &[1.0, -9.0, f32::NAN, f32::NEG_INFINITY]);
    FillKernel::<f16>::try_clamp(&dev, &mut half.vec, 2.0).unwrap();
    let got = half.read(&dev);
    assert_eq!(&got[..2], &[1.0, -2.0]);
    assert!(got[2].is_nan(), "clamping keeps NaN");
    assert_eq!(got[3], -2.0);

    // Across many blocks, in every precision, into the same slots.
    for_each_precision(&mut LongReductions { dev, stats });
}

#[test]
fn fill_rounds_like_a_cast_and_keeps_the_sign_of_zero() {
    let dev = cuda_or_skip!(0);
    let mut buf = Buf::<Cuda, f32>::new(&dev, &vec![3.0; LONG]);
    FillKernel::<f32>::try_fill(&dev, &mut buf.vec, 1.5).unwrap();
    assert!(buf.read(&dev).iter().all(|x| *x == 1.5));
    FillKernel::<f32>::try_fill(&dev, &mut buf.vec, 0.0).unwrap();
    assert!(buf.read(&dev).iter().all(|x| x.to_bits() == 0));
    FillKernel::<f32>::try_fill(&dev, &mut buf.vec, -0.0).unwrap();
    assert!(buf
        .read(&dev)
        .iter()
        .all(|x| x.to_bits() == (-0.0f32).to_bits()));

    let mut half = Buf::<Cuda, f16>::new(&dev, &vec![3.0; LONG]);
    FillKernel::<f16>::try_fill(&dev, &mut half.vec, 0.1).unwrap();
    let tenth = f16::from_f32(0.1).to_f32();
    assert!(half.read(&dev).iter().all(|x| *x == tenth));
    FillKernel::<f16>::try_fill(&dev, &mut half.vec, 65520.0).unwrap();
    assert!(half.read(&dev).iter().all(|x| *x == f32::INFINITY));
    FillKernel::<f16>::try_fill(&dev, &mut half.vec, 0.0).unwrap();
    assert!(half.read(&dev).iter().all(|x| x.to_bits() == 0));
}

#[test]
fn empty_buffers_are_no_ops_that_still_set_their_slot() {
    let dev = cuda_or_skip!(0);
    // Separate allocations rather than clones: a clone of an empty buffer would test dfdx.
    let empty32 = <Cuda as Storage<f32>>::try_alloc_len(&dev, 0).unwrap();
    let empty16 = <Cuda as Storage<f16>>::try_alloc_len(&dev, 0).unwrap();
    let mut a = <Cuda as Storage<f32>>::try_alloc_len(&dev, 0).unwrap();
    let mut b = <Cuda as Storage<f16>>::try_alloc_len(&dev, 0).unwrap();
    let mut stats = dev.try_alloc_stats(3).unwrap();
    for slot in 0..3 {
        dirty_slot(&dev, &mut stats, slot);
    }
    UnscaleKernel::<f16>::try_unscale_to_f32(&dev, &empty16, &mut a, 0.5, &mut stats, 0).unwrap();
    ReduceKernel::<f32>::try_sum_squares(&dev, &empty32, &mut stats, 1).unwrap();
    ReduceKernel::<f16>::try_max_abs(&dev, &empty16, &mut stats, 2).unwrap();
    assert_eq!(dev.try_read_stats(&stats).unwrap(), vec![0.0, 0.0, 0.0]);
    dirty_slot(&dev, &mut stats, 0);
    UnscaleKernel::<f16>::try_unscale_in_place(&dev, &mut b, 0.5, &mut stats, 0).unwrap();
    assert_eq!(dev.try_read_stats(&stats).unwrap()[0], 0.0);

    FillKernel::<f32>::try_fill(&dev, &mut a, 1.0).unwrap();
    HostKernel::<f16>::try_write(&dev, &mut b, &[]).unwrap();
    FillKernel::<f16>::try_scale(&dev, &mut b, 2.0).unwrap();
    FillKernel::<f32>::try_clamp(&dev, &mut a, 2.0).unwrap();
    CastKernel::<f32, f16>::try_add_cast(&dev, &empty32, &mut b).unwrap();
    CastKernel::<f16, f32>::try_copy_cast(&dev, &empty16, &mut a).unwrap();
    assert!(HostKernel::<f16>::try_read(&dev, &b).unwrap().is_empty());
    assert!(HostKernel::<f32>::try_read(&dev, &a).unwrap().is_empty());
    assert!(dev
        .try_read_stats(&dev.try_alloc_stats(0).unwrap())
        .unwrap()
        .is_empty());
}

// ---------------------------------------------------------------------------------------------
// End to end: the same model and batches trained on the CPU and on CUDA.

const BATCH: usize = 8;
const IN: usize = 6;
const OUT: usize = 3;

/// Tanh rather than ReLU: dfdx's FP16 ReLU maps NaN to 0 on the CPU but keeps it on CUDA
/// (`__hmax_nan`), which would make where a NaN input ends up differ between the devices for
/// reasons outside typed-amp. Tanh keeps NaN on both.
type Mlp = (Linear<IN, 8>, Tanh, Linear<8, 8>, Tanh, Linear<8, OUT>);

const PARAMS: [&str; 6] = [
    "0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias",
];

/// What happens in one step.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Step {
    Clean,
    /// A NaN in the input: every gradient it reaches is NaN.
    NanInput,
    /// A static scale of 2^24: the FP16 gradient of the logits overflows whatever the data (it
    /// is at least 2^24 * 0.03 / BATCH for some element of every column with three classes).
    /// The step's outcome updates that static scaler, which scaled its loss: the dynamic one
    /// does not see this step.
    Overflow,
    /// NaN written into one working gradient after backward.
    PoisonGrad,
}

const PLAN: [Step; 9] = [
    Step::Clean,
    Step::Clean,
    Step::NanInput,
    Step::Clean,
    Step::Overflow,
    Step::Clean,
    Step::PoisonGrad,
    Step::Clean,
    Step::Clean,
];

/// What the scaler reported for one step; must be the same on both devices.
#[derive(Debug, PartialEq)]
struct Record {
    found_inf: bool,
    non_finite_params: Vec<String>,
    skipped: bool,
    /// The dynamic scaler's scale after the step.
    scale_after: f32,
    /// Steps skipped so far, counted by both scalers together.
    skipped_steps: u64,
}

/// The result of a run: per step its record and the global gradient norm, then the master
/// weights and the working weights (as FP32) per parameter.
type Run = (Vec<(Record, f32)>, Vec<Vec<f32>>, Vec<Vec<f32>>);

/// The host data of step `step`: inputs (already FP16 values) and one-hot targets.
fn batch(step: usize, kind: Step) -> (Vec<f16>, Vec<f32>) {
    let mut rng = StdRng::seed_from_u64(100 + step as u64);
    let mut x: Vec<f16> = (0..BATCH * IN)
        .map(|_| f16::from_f32(rng.sample(StandardNormal)))
        .collect();
    if kind == Step::NanInput {
        x[5] = f16::NAN;
    }
    let mut y = vec![0.0; BATCH * OUT];
    for row in y.chunks_mut(OUT) {
        row[rng.gen_range(0..OUT)] = 1.0;
    }
    (x, y)
}

/// Trains a copy of `master` on `dev` through `PLAN`. A macro rather than a function generic in
/// the device, whose bounds would restate half of dfdx.
macro_rules! train {
    ($dev:expr, $master:expr) => {{
        let dev = $dev;
        let mut model = MasterWeights::fp16($master, dev).unwrap();
        let mut opt = Sgd::new(
            model.master(),
            SgdConfig {
                lr: 0.05,
                momentum: Some(Momentum::Classic(0.9)),
                weight_decay: None,
            },
        );
        let mut scaler = GradScaler::new(1024.0, 2.0, 0.5, 1000).unwrap();
        // A dynamic scale of 2^24 makes the scaled loss's FP16 gradients overflow (a static
        // scale above FP16's largest value is refused by every constructor).
        let mut overflowing = GradScaler::new(2f32.powi(24), 2.0, 0.5, 1000).unwrap();
        let mut grads = model.alloc_grads().unwrap();
        let mut records = Vec::new();
        for (step, kind) in PLAN.into_iter().enumerate() {
            let (x, y) = batch(step, kind);
            let x = dev.tensor_from_vec(x, (Const::<BATCH>, Const::<IN>));
            let y = dev.tensor_from_vec(y, (Const::<BATCH>, Const::<OUT>));
            let s = if kind == Step::Overflow {
                &mut overflowing
            } else {
                &mut scaler
            };
            let logits = model.working().forward(x.traced_mixed(grads));
            let loss = cross_entropy_with_logits_loss(logits.to_f32(), y);
            let mut scaled = s.scale(loss).backward().unwrap();
            if kind == Step::PoisonGrad {
                let buf = scaled
                    .grads_mut()
                    .store_mut::<f16>()
                    .get_or_alloc_mut(&model.working().2.bias)
                    .unwrap();
                FillKernel::<f16>::try_fill(dev, buf, f32::NAN).unwrap();
            }
            let mut unscaled = s.unscale(&mut model, scaled).unwrap();
            let norm = unscaled.global_norm().unwrap();
            let found_inf = unscaled.found_inf();
            let non_finite_params = unscaled.non_finite_params().to_vec();
            let outcome = s.step(&mut opt, unscaled).unwrap();
            let skipped = outcome.skipped();
            grads = s.update(outcome).unwrap();
            records.push((
                Record {
                    found_inf,
                    non_finite_params,
                    skipped,
                    scale_after: scaler.get_scale(),
                    skipped_steps: scaler.skipped_steps() + overflowing.skipped_steps(),
                },
                norm,
            ));
        }
        let (m, w) = (model.master(), model.working());
        let master = vec![
            m.0.weight.as_vec(),
            m.0.bias.as_vec(),
            m.2.weight.as_vec(),
            m.2.bias.as_vec(),
            m.4.weight.as_vec(),
            m.4.bias.as_vec(),
        ];
        let working: Vec<Vec<f32>> = [
            w.0.weight.as_vec(),
            w.0.bias.as_vec(),
            w.2.weight.as_vec(),
            w.2.bias.as_vec(),
            w.4.weight.as_vec(),
            w.4.bias.as_vec(),
        ]
        .into_iter()
        .map(|p| p.into_iter().map(f16::to_f32).collect())
        .collect();
        let run: Run = (records, master, working);
        run
    }};
}

#[test]
fn training_on_cuda_matches_the_cpu() {
    let gpu = cuda_or_skip!(7);
    let cpu = Cpu::seed_from_u64(7);
    let initial = cpu.build_module::<Mlp, f32>();
    let start: Vec<Vec<f32>> = vec![
        initial.0.weight.as_vec(),
        initial.0.bias.as_vec(),
        initial.2.weight.as_vec(),
        initial.2.bias.as_vec(),
        initial.4.weight.as_vec(),
        initial.4.bias.as_vec(),
    ];
    let on_gpu = initial.to_device(&gpu);
    let (cpu_steps, cpu_master, cpu_working) = train!(&cpu, initial);
    let (gpu_steps, gpu_master, gpu_working) = train!(&gpu, on_gpu);

    // The run exercises what it means to: clean steps, and each kind of non-finite gradient
    // found and the step skipped.
    for ((record, _), kind) in cpu_steps.iter().zip(PLAN) {
        assert_eq!(record.found_inf, kind != Step::Clean, "{kind:?} on the CPU");
        assert_eq!(record.skipped, record.found_inf);
    }
    let poisoned = PLAN.iter().position(|k| *k == Step::PoisonGrad).unwrap();
    assert_eq!(cpu_steps[poisoned].0.non_finite_params, ["2.bias"]);
    // Every skipped step was counted once, by the scaler that scaled its loss; the dynamic
    // scaler backed off on its own two (NaN input, poisoned gradient) and never grew.
    let last = &cpu_steps.last().unwrap().0;
    let bad = PLAN.iter().filter(|k| **k != Step::Clean).count();
    assert_eq!(last.skipped_steps, bad as u64);
    assert_eq!(last.scale_after, 1024.0 / 4.0);

    // The same decisions on both devices, step by step.
    for (step, ((c, c_norm), (g, g_norm))) in cpu_steps.iter().zip(&gpu_steps).enumerate() {
        assert_eq!(c, g, "step {step} ({:?})", PLAN[step]);
        assert_eq!(c_norm.is_finite(), g_norm.is_finite(), "step {step}");
        if c_norm.is_finite() {
            // Each device's gradients are within R·ε·max|g| of exact, R = 7 for three FP16
            // layers (tests/mixed_gradients.rs); the norm, dominated by the largest elements,
            // inherits about that relative error, so the devices differ by about 14ε. 2^-6 = 16ε
            // leaves a little room for their different tanh; it is not a worst-case bound.
            let rel = (c_norm - g_norm).abs() / c_norm;
            assert!(
                rel < 2f32.powi(-6),
                "step {step}: norm {c_norm} vs {g_norm}"
            );
        }
    }

    for (p, path) in PARAMS.iter().enumerate() {
        // The working copy is the master rounded to FP16, exactly, on each device.
        for (who, master, working) in [
            ("CPU", &cpu_master[p], &cpu_working[p]),
            ("CUDA", &gpu_master[p], &gpu_working[p]),
        ] {
            let rounded: Vec<f32> = master.iter().map(|x| f16::from_f32(*x).to_f32()).collect();
            assert_same_bits(&rounded, working, &format!("{path} working copy on {who}"));
        }

        // Master weights: the devices' gradients differ by FP16 rounding only, so the updates
        // they add up to may differ by a small fraction of the update itself. 2^-5 of the
        // largest update is 64 FP16 ulps of it: generous for rounding, far too tight for a
        // wrong kernel (a missing or doubled unscale, a lost accumulation), which is off by
        // the whole update.
        let update = cpu_master[p]
            .iter()
            .zip(&start[p])
            .map(|(w, w0)| (w - w0).abs())
            .fold(0f32, f32::max);
        assert!(update > 0.0, "{path} did not train");
        let diff = cpu_master[p]
            .iter()
            .zip(&gpu_master[p])
            .map(|(c, g)| (c - g).abs())
            .fold(0f32, f32::max);
        assert!(
            diff <= update * 2f32.powi(-5),
            "{path}: CPU and CUDA master weights differ by {diff}, the update was {update}"
        );
    }
}
