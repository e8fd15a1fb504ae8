//! typed-amp's CUDA kernels against the CPU implementation, and a short mixed-precision training
//! run on both devices.
//!
//! Every test first opens GPU 0 and, where that fails, prints why and passes: these tests build
//! everywhere with `--features cuda` but run only where a GPU is. (A test binary linked against a
//! `libcuda` that the machine lacks cannot start at all; that is the loader's doing, not theirs.)
#![cfg(feature = "cuda")]

use std::panic::catch_unwind;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;
use typed_amp::dfdx::nn::ToDevice;
use typed_amp::dfdx::optim::Sgd;
use typed_amp::loss::cross_entropy_with_logits_loss;
use typed_amp::precision::{AnyBuf, AnyBufMut};
use typed_amp::prelude::*;
use typed_amp::AmpElem;

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

#[derive(Debug, Clone, Copy, PartialEq)]
enum Prec {
    F32,
    F16,
}

const PRECS: [Prec; 2] = [Prec::F32, Prec::F16];

/// A buffer of either precision, owned, on any device.
enum Buf<D: AmpDevice> {
    F32(<D as Storage<f32>>::Vec),
    F16(<D as Storage<f16>>::Vec),
}

impl<D: AmpDevice> Buf<D> {
    /// A buffer of `values`, rounded to `prec` on the host (so every device gets the same bits).
    fn new(dev: &D, prec: Prec, values: &[f32]) -> Self {
        let n = values.len();
        match prec {
            Prec::F32 => {
                let t: Tensor<(usize,), f32, D> = dev.tensor_from_vec(values.to_vec(), (n,));
                Buf::F32(t.storage().clone())
            }
            Prec::F16 => {
                let v = values.iter().map(|x| f16::from_f32(*x)).collect();
                let t: Tensor<(usize,), f16, D> = dev.tensor_from_vec(v, (n,));
                Buf::F16(t.storage().clone())
            }
        }
    }

    fn view(&self) -> AnyBuf<'_, D> {
        match self {
            Buf::F32(b) => AnyBuf::F32(b),
            Buf::F16(b) => AnyBuf::F16(b),
        }
    }

    fn view_mut(&mut self) -> AnyBufMut<'_, D> {
        match self {
            Buf::F32(b) => AnyBufMut::F32(b),
            Buf::F16(b) => AnyBufMut::F16(b),
        }
    }

    fn read(&self, dev: &D) -> Vec<f32> {
        dev.try_read_f32(self.view()).unwrap()
    }
}

/// Sets `stats[slot]` to 1 through a flagged unscale, so that a test can see whether the next
/// kernel into that slot starts from zero, as slots reused from step to step must.
fn dirty_slot<D: AmpDevice>(dev: &D, stats: &mut D::Stats, slot: usize) {
    let inf = Buf::new(dev, Prec::F32, &[f32::INFINITY]);
    let mut out = Buf::new(dev, Prec::F32, &[0.0]);
    dev.try_unscale(inf.view(), out.view_mut(), 1.0, stats, slot)
        .unwrap();
    assert_eq!(dev.try_read_stats(stats).unwrap()[slot], 1.0);
}

/// Every kernel, with its scalar argument.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// `try_write_f32` of the source values (as FP32, whatever `sp` says) into the destination.
    Write,
    AddCast,
    CopyCast,
    Unscale(f32),
    UnscaleInPlace(f32),
    Fill(f32),
    Scale(f32),
    Clamp(f32),
    SumSquares,
    MaxAbs,
}

/// Runs `op` on `dev` from a source of precision `sp` holding `src` into a destination of
/// precision `dp` holding `dst` (in-place ops work on the destination, reductions read the
/// source), with its stats slot dirtied first. Returns the destination and the slot.
fn run_on<D: AmpDevice>(
    dev: &D,
    op: Op,
    (sp, src): (Prec, &[f32]),
    (dp, dst): (Prec, &[f32]),
) -> (Vec<f32>, f32) {
    let source = Buf::new(dev, sp, src);
    let mut target = Buf::new(dev, dp, dst);
    let mut stats = dev.try_alloc_stats(2).unwrap();
    dirty_slot(dev, &mut stats, 1);
    let (s, d) = (source.view(), target.view_mut());
    match op {
        Op::Write => dev.try_write_f32(d, src),
        Op::AddCast => dev.try_add_cast(s, d),
        Op::CopyCast => dev.try_copy_cast(s, d),
        Op::Unscale(inv) => dev.try_unscale(s, d, inv, &mut stats, 1),
        Op::UnscaleInPlace(inv) => dev.try_unscale_in_place(d, inv, &mut stats, 1),
        Op::Fill(value) => dev.try_fill(d, value),
        Op::Scale(factor) => dev.try_scale(d, factor),
        Op::Clamp(limit) => dev.try_clamp(d, limit),
        Op::SumSquares => dev.try_sum_squares(s, &mut stats, 1),
        Op::MaxAbs => dev.try_max_abs(s, &mut stats, 1),
    }
    .unwrap();
    let stats = dev.try_read_stats(&stats).unwrap();
    assert_eq!(stats[0], 0.0, "{op:?} wrote outside its slot");
    (target.read(dev), stats[1])
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

#[test]
fn every_kernel_matches_the_cpu_bit_for_bit_in_every_precision() {
    let gpu = cuda_or_skip!(0);
    let cpu = Cpu::default();
    let n = 3 * 256 + 5;
    let plain = awkward_values(n, 1);
    let other = awkward_values(n, 2);
    let mut with_specials = awkward_values(n, 3);
    with_specials[n / 2] = f32::NAN;
    with_specials[n - 1] = f32::NEG_INFINITY;
    let ops = [
        Op::Write,
        Op::AddCast,
        Op::CopyCast,
        Op::Unscale(2f32.powi(-16)),
        Op::Unscale(0.1),
        // Scaling up overflows FP16 destinations: inf there, but no flag (the flag is on src).
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
    for op in ops {
        for sp in PRECS {
            for dp in PRECS {
                for src in [&plain, &with_specials] {
                    for dst in [&other, &with_specials] {
                        let what = format!("{op:?} {sp:?} -> {dp:?}");
                        let (c, c_slot) = run_on(&cpu, op, (sp, src), (dp, dst));
                        let (g, g_slot) = run_on(&gpu, op, (sp, src), (dp, dst));
                        assert_same_bits(&c, &g, &what);
                        assert_eq!(bits(c_slot), bits(g_slot), "{what}: stats slot");
                    }
                }
            }
        }
    }
}

#[test]
fn sum_of_squares_agrees_with_the_cpu_to_rounding() {
    let gpu = cuda_or_skip!(0);
    let cpu = Cpu::default();
    // Moderate magnitudes (no FP16 overflow), so that this measures accuracy only.
    let mut rng = StdRng::seed_from_u64(4);
    let values: Vec<f32> = (0..100_003)
        .map(|_| rng.sample::<f32, _>(StandardNormal) * 2f32.powi(rng.gen_range(-4..5)))
        .collect();
    for prec in PRECS {
        let by_hand: f64 = values
            .iter()
            .map(|x| match prec {
                Prec::F32 => f64::from(*x),
                Prec::F16 => f64::from(f16::from_f32(*x).to_f32()),
            })
            .map(|x| x * x)
            .sum();
        let (_, c) = run_on(&cpu, Op::SumSquares, (prec, &values), (Prec::F32, &[]));
        let (_, g) = run_on(&gpu, Op::SumSquares, (prec, &values), (Prec::F32, &[]));
        // Both accumulate in FP32, in different orders. Every term is non-negative, so there is
        // no cancellation: the worst case for 100,003 terms added one by one is n·2^-24 ≈ 6e-3,
        // but the CPU's eight lanes and the GPU's tree keep the chains short and the errors of
        // random rounding grow like √n, so 1e-4 is a statistical bound, not a worst case. A
        // lost block of the GPU's grid would lose 1/391 of the sum, 25 times more.
        for (who, got) in [("CPU", c), ("CUDA", g)] {
            let err = (f64::from(got) - by_hand).abs() / by_hand;
            assert!(err < 1e-4, "{prec:?} on {who}: {got} vs {by_hand}");
        }
    }
}

#[test]
fn unscale_flags_non_finite_in_either_precision_across_blocks() {
    let dev = cuda_or_skip!(0);
    let mut values = vec![2.0f32; LONG];
    let mut stats = dev.try_alloc_stats(3).unwrap();
    let mut dst = Buf::new(&dev, Prec::F32, &values);

    let src = Buf::new(&dev, Prec::F32, &values);
    dev.try_unscale(src.view(), dst.view_mut(), 0.25, &mut stats, 0)
        .unwrap();
    assert!(dst.read(&dev).iter().all(|x| *x == 0.5));

    // A single inf in the grid's last partial pass.
    *values.last_mut().unwrap() = f32::INFINITY;
    let src = Buf::new(&dev, Prec::F16, &values);
    dev.try_unscale(src.view(), dst.view_mut(), 0.25, &mut stats, 1)
        .unwrap();
    assert!(dst.read(&dev).last().unwrap().is_infinite());

    values[GRID_PASS + 1] = f32::NAN;
    let mut src = Buf::new(&dev, Prec::F16, &values);
    dev.try_unscale_in_place(src.view_mut(), 0.5, &mut stats, 2)
        .unwrap();
    assert_eq!(src.read(&dev)[0], 1.0);
    assert_eq!(dev.try_read_stats(&stats).unwrap(), vec![0.0, 1.0, 1.0]);

    // Slots are reused from step to step: a clean buffer clears what an earlier step set, and a
    // bad one sets a slot that was clear, whatever the precision pair.
    let clean = vec![2.0f32; LONG];
    let mut bad = clean.clone();
    bad[3] = f32::NEG_INFINITY;
    let half_clean = Buf::new(&dev, Prec::F16, &clean);
    let mut half_dst = Buf::new(&dev, Prec::F16, &clean);
    dev.try_unscale(half_clean.view(), half_dst.view_mut(), 0.25, &mut stats, 1)
        .unwrap();
    let mut f32_clean = Buf::new(&dev, Prec::F32, &clean);
    dev.try_unscale_in_place(f32_clean.view_mut(), 0.5, &mut stats, 2)
        .unwrap();
    let f32_bad = Buf::new(&dev, Prec::F32, &bad);
    dev.try_unscale(f32_bad.view(), half_dst.view_mut(), 0.25, &mut stats, 0)
        .unwrap();
    assert_eq!(dev.try_read_stats(&stats).unwrap(), vec![1.0, 0.0, 0.0]);
    assert_eq!(half_dst.read(&dev)[3], f32::NEG_INFINITY);
    assert_eq!(half_dst.read(&dev)[4], 0.5);
}

#[test]
fn casts_round_trip_accumulate_and_overflow_like_hardware() {
    let dev = cuda_or_skip!(0);
    let n = GRID_PASS + 3;
    let values: Vec<f32> = (0..n).map(|i| (i % 4096) as f32 * 0.5).collect();
    let src = Buf::new(&dev, Prec::F32, &values);
    let mut half = Buf::new(&dev, Prec::F16, &vec![1.0; n]);
    dev.try_add_cast(src.view(), half.view_mut()).unwrap();
    let got = half.read(&dev);
    assert_eq!(got[10], 6.0);
    assert_eq!(got[n - 1], 1.0 + ((n - 1) % 4096) as f32 * 0.5);
    let mut back = Buf::new(&dev, Prec::F32, &vec![0.0; n]);
    dev.try_copy_cast(half.view(), back.view_mut()).unwrap();
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
    let src = Buf::new(&dev, Prec::F32, &edges);
    let mut half = Buf::new(&dev, Prec::F16, &[0.0; 6]);
    dev.try_copy_cast(src.view(), half.view_mut()).unwrap();
    let got = half.read(&dev);
    assert_eq!(
        &got[..5],
        &[65504.0, 65504.0, f32::INFINITY, f32::NEG_INFINITY, 1.0]
    );
    assert!(got[5].is_nan());

    let short = Buf::new(&dev, Prec::F32, &[1.0]);
    assert!(dev.try_copy_cast(short.view(), back.view_mut()).is_err());
    assert!(dev.try_add_cast(short.view(), back.view_mut()).is_err());
    let mut short_half = Buf::new(&dev, Prec::F16, &[1.0]);
    assert!(dev
        .try_copy_cast(src.view(), short_half.view_mut())
        .is_err());
}

#[test]
fn bad_arguments_are_errors_that_touch_nothing() {
    let dev = cuda_or_skip!(0);
    let mut stats = dev.try_alloc_stats(2).unwrap();
    dirty_slot(&dev, &mut stats, 0);
    let src = Buf::new(&dev, Prec::F16, &[f32::INFINITY, 1.0, 2.0]);
    let mut dst = Buf::new(&dev, Prec::F32, &[7.0, 7.0]);
    assert!(dev
        .try_unscale(src.view(), dst.view_mut(), 0.5, &mut stats, 0)
        .is_err());
    assert!(dev
        .try_unscale(src.view(), dst.view_mut(), 0.5, &mut stats, 1)
        .is_err());
    // A slot past the end is an error, not a write out of bounds.
    let mut fits = Buf::new(&dev, Prec::F32, &[7.0, 7.0, 7.0]);
    assert!(dev
        .try_unscale(src.view(), fits.view_mut(), 0.5, &mut stats, 2)
        .is_err());
    assert!(dev
        .try_unscale_in_place(fits.view_mut(), 0.5, &mut stats, 2)
        .is_err());
    assert!(dev.try_sum_squares(src.view(), &mut stats, 2).is_err());
    assert!(dev.try_write_f32(dst.view_mut(), &[1.0, 2.0, 3.0]).is_err());
    assert!(dev.try_max_abs(src.view(), &mut stats, 2).is_err());
    assert_eq!(dev.try_read_stats(&stats).unwrap(), vec![1.0, 0.0]);
    assert_eq!(dst.read(&dev), vec![7.0, 7.0]);
    assert_eq!(fits.read(&dev), vec![7.0, 7.0, 7.0]);
}

#[test]
fn reductions_for_clipping() {
    let dev = cuda_or_skip!(0);
    let mut stats = dev.try_alloc_stats(2).unwrap();
    let values = [3.0, -4.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 12.0];
    let buf = Buf::new(&dev, Prec::F32, &values);
    for _ in 0..2 {
        // Twice into the same slots: each result starts from zero.
        dev.try_sum_squares(buf.view(), &mut stats, 0).unwrap();
        dev.try_max_abs(buf.view(), &mut stats, 1).unwrap();
        assert_eq!(dev.try_read_stats(&stats).unwrap(), vec![169.0, 12.0]);
    }
    let mut buf = buf;
    dev.try_clamp(buf.view_mut(), 3.5).unwrap();
    assert_eq!(&buf.read(&dev)[..2], &[3.0, -3.5]);
    dev.try_scale(buf.view_mut(), 2.0).unwrap();
    assert_eq!(buf.read(&dev)[8], 7.0);
    let mut half = Buf::new(&dev, Prec::F16, &[1.0, -9.0, f32::NAN, f32::NEG_INFINITY]);
    dev.try_clamp(half.view_mut(), 2.0).unwrap();
    let got = half.read(&dev);
    assert_eq!(&got[..2], &[1.0, -2.0]);
    assert!(got[2].is_nan(), "clamping keeps NaN");
    assert_eq!(got[3], -2.0);

    // Across many blocks: small integers square and add exactly in FP32 in any order (every
    // partial sum is an integer below 2^24), so the result is exact.
    let long: Vec<f32> = (0..LONG).map(|i| (i % 7) as f32 - 3.0).collect();
    let exact: u64 = (0..LONG).map(|i| ((i % 7) as i64 - 3).pow(2) as u64).sum();
    assert!(exact < 1 << 24);
    for prec in PRECS {
        let mut long = long.clone();
        let buf = Buf::new(&dev, prec, &long);
        dev.try_sum_squares(buf.view(), &mut stats, 0).unwrap();
        dev.try_max_abs(buf.view(), &mut stats, 1).unwrap();
        assert_eq!(
            dev.try_read_stats(&stats).unwrap(),
            vec![exact as f32, 3.0],
            "{prec:?}"
        );

        // The largest magnitude in the last partial pass, then inf, then NaN over inf.
        long[LONG - 1] = -7.5;
        let buf = Buf::new(&dev, prec, &long);
        dev.try_max_abs(buf.view(), &mut stats, 1).unwrap();
        assert_eq!(dev.try_read_stats(&stats).unwrap()[1], 7.5, "{prec:?}");
        long[GRID_PASS] = f32::NEG_INFINITY;
        let buf = Buf::new(&dev, prec, &long);
        dev.try_max_abs(buf.view(), &mut stats, 1).unwrap();
        dev.try_sum_squares(buf.view(), &mut stats, 0).unwrap();
        assert_eq!(
            dev.try_read_stats(&stats).unwrap(),
            vec![f32::INFINITY, f32::INFINITY],
            "{prec:?}"
        );
        long[5] = f32::NAN;
        let buf = Buf::new(&dev, prec, &long);
        dev.try_max_abs(buf.view(), &mut stats, 1).unwrap();
        dev.try_sum_squares(buf.view(), &mut stats, 0).unwrap();
        let read = dev.try_read_stats(&stats).unwrap();
        assert!(read[0].is_nan() && read[1].is_nan(), "{prec:?}: {read:?}");
    }
}

#[test]
fn fill_rounds_like_a_cast_and_keeps_the_sign_of_zero() {
    let dev = cuda_or_skip!(0);
    let mut buf = Buf::new(&dev, Prec::F32, &vec![3.0; LONG]);
    dev.try_fill(buf.view_mut(), 1.5).unwrap();
    assert!(buf.read(&dev).iter().all(|x| *x == 1.5));
    dev.try_fill(buf.view_mut(), 0.0).unwrap();
    assert!(buf.read(&dev).iter().all(|x| x.to_bits() == 0));
    dev.try_fill(buf.view_mut(), -0.0).unwrap();
    assert!(buf
        .read(&dev)
        .iter()
        .all(|x| x.to_bits() == (-0.0f32).to_bits()));

    let mut half = Buf::new(&dev, Prec::F16, &vec![3.0; LONG]);
    dev.try_fill(half.view_mut(), 0.1).unwrap();
    let tenth = f16::from_f32(0.1).to_f32();
    assert!(half.read(&dev).iter().all(|x| *x == tenth));
    dev.try_fill(half.view_mut(), 65520.0).unwrap();
    assert!(half.read(&dev).iter().all(|x| *x == f32::INFINITY));
    dev.try_fill(half.view_mut(), 0.0).unwrap();
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
    dev.try_unscale(
        AnyBuf::F16(&empty16),
        AnyBufMut::F32(&mut a),
        0.5,
        &mut stats,
        0,
    )
    .unwrap();
    dev.try_sum_squares(AnyBuf::F32(&empty32), &mut stats, 1)
        .unwrap();
    dev.try_max_abs(AnyBuf::F16(&empty16), &mut stats, 2)
        .unwrap();
    assert_eq!(dev.try_read_stats(&stats).unwrap(), vec![0.0, 0.0, 0.0]);
    dirty_slot(&dev, &mut stats, 0);
    dev.try_unscale_in_place(AnyBufMut::F16(&mut b), 0.5, &mut stats, 0)
        .unwrap();
    assert_eq!(dev.try_read_stats(&stats).unwrap()[0], 0.0);

    dev.try_fill(AnyBufMut::F32(&mut a), 1.0).unwrap();
    dev.try_write_f32(AnyBufMut::F16(&mut b), &[]).unwrap();
    dev.try_scale(AnyBufMut::F16(&mut b), 2.0).unwrap();
    dev.try_clamp(AnyBufMut::F32(&mut a), 2.0).unwrap();
    dev.try_add_cast(AnyBuf::F32(&empty32), AnyBufMut::F16(&mut b))
        .unwrap();
    dev.try_copy_cast(AnyBuf::F16(&empty16), AnyBufMut::F32(&mut a))
        .unwrap();
    assert!(dev.try_read_f32(AnyBuf::F16(&b)).unwrap().is_empty());
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
    scale_after: f32,
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
        let overflowing = GradScaler::with_static_scale(2f32.powi(24)).unwrap();
        let mut grads = model.alloc_grads().unwrap();
        let mut records = Vec::new();
        for (step, kind) in PLAN.into_iter().enumerate() {
            let (x, y) = batch(step, kind);
            let x = dev.tensor_from_vec(x, (Const::<BATCH>, Const::<IN>));
            let y = dev.tensor_from_vec(y, (Const::<BATCH>, Const::<OUT>));
            let s = if kind == Step::Overflow {
                &overflowing
            } else {
                &scaler
            };
            let logits = model.working().forward(x.traced_mixed(grads));
            let loss = cross_entropy_with_logits_loss(logits.to_f32(), y);
            let mut scaled = s.scale(loss).backward().unwrap();
            if kind == Step::PoisonGrad {
                let buf = <f16 as AmpElem>::grads_mut(scaled.grads_mut())
                    .get_or_alloc_mut(&model.working().2.bias)
                    .unwrap();
                dev.try_fill(AnyBufMut::F16(buf), f32::NAN).unwrap();
            }
            let mut unscaled = s.unscale(&mut model, scaled).unwrap();
            let norm = unscaled.global_norm(&model).unwrap();
            let found_inf = unscaled.found_inf();
            let non_finite_params = unscaled.non_finite_params().to_vec();
            let outcome = s.step(&mut opt, &mut model, unscaled).unwrap();
            scaler.update(outcome.found_inf).unwrap();
            records.push((
                Record {
                    found_inf,
                    non_finite_params,
                    skipped: outcome.skipped,
                    scale_after: scaler.get_scale(),
                },
                norm,
            ));
            grads = outcome.grads;
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
