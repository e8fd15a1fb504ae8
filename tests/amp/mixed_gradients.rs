//! Gradients through graphs with 16-bit layers and an FP32 loss match a pure-FP32 reference, in
//! FP16 and in BF16.
//!
//! Each graph builds an FP32 reference model, rounds its weights to values of the 16-bit
//! precision, and pairs it with a mixed-precision working copy holding exactly those values
//! (16-bit linear and conv layers; batch norm, layer norm, softmax and the loss in FP32). Both see
//! the same input (also representable in the 16-bit precision), so every difference between
//! their gradients comes from 16-bit arithmetic in the working copy's forward and backward
//! passes, plus nothing from the step: FP16 graphs go through a loss scaler whose scale is a
//! power of two, so scaling and unscaling are exact; BF16 graphs take the scale-free step
//! (`loss.backward()?.check(&mut model)?`), which divides by nothing, and each BF16 graph also
//! checks that a `GradScaler` at scale 1 (`scale` → `backward` → `unscale`) gives the same
//! gradients bit for bit.
//!
//! Tolerance. A 16-bit op rounds its result once, to a relative error of at most the unit
//! roundoff `u = ε/2`, with `ε` the precision's machine epsilon: FP16 `u = 2^-11`
//! (`ε = 2^-10`), BF16 `u = 2^-8` (`ε = 2^-7`). dfdx's 16-bit matmul and convolution accumulate
//! in FP32 and round once at the end, and the vendored dfdx's BF16 sums and broadcast backwards
//! accumulate in FP32 too. To first order, the rounding errors along a gradient's path add up,
//! each bounded by `u` times the magnitude of the value rounded. A parameter's gradient depends
//! on the 16-bit activations of every layer before the loss and on the 16-bit gradients of every
//! layer after it, so its path has at most `R = 2·L + 1` roundings for a network with `L` 16-bit
//! layers (one forward output and one backward product per layer, plus the cast of the loss
//! gradient into 16 bits). Each test checks, per parameter, `max |g16 − g32| ≤ R·ε·max |g32|`
//! (`R·2u`): the first-order bound with a factor 2 for the sums of same-signed errors in
//! reductions. The count `R` does not depend on the precision (the roundings happen at the same
//! places in both working copies, casts included), so a graph's FP16 and BF16 bounds differ by
//! BF16's `u` over FP16's, 2^3.
//!
//! Kinks. The first-order bound assumes both passes take the same branch at every kink. ReLU is
//! not differentiable at 0: a pre-activation closer to 0 than the forward rounding error can be
//! positive in FP32 and zero or negative in 16 bits, and then one sample's whole contribution
//! through that unit is in one gradient and not in the other, a jump no rounding count bounds.
//! (It happens: in the MLP's first BF16 batch, sample 15's pre-activation of unit 1 in the
//! second layer is 4.5e-4 in FP32 and exactly 0 in BF16, where the product and the bias round to
//! opposite values, and two elements of that layer's weight gradient then differ by 0.003, 7%
//! of `max|g32|` against a bound of 5.5%.) The MLP test therefore compares the ReLU masks of the
//! two forward passes, checks that every flip is within the forward rounding error of 0, and
//! draws the next batch from the same seeded device when they differ, reporting each rejected
//! flip: BF16 rejects three batches, FP16 none. The tolerance is the same for every batch.

use approx::assert_abs_diff_eq;
use typed_amp::dfdx::nn::builders::{BatchNorm2D, LayerNorm1D, Linear};
use typed_amp::loss::{cross_entropy_with_logits_loss, mse_loss};
use typed_amp::nn::builders::{Conv2D, Flatten, MaxPool2D, ToBf16, ToF16, ToF32};
use typed_amp::params::{Mutable, ParamVisitor};
use typed_amp::precision::dtype_of;
use typed_amp::prelude::*;
use typed_amp::step::StepKind;
use typed_amp::{loss::Loss, precision::AmpElem, precision::DType, step::UnscaledGrads};
use typed_amp::{master::Fp32Weights, params::Parameters};

/// A power-of-two scale that keeps these small models' FP16 gradients far from overflow.
const SCALE: f32 = 1024.0;

/// A 16-bit precision the graphs run in: how values are rounded to it, its machine epsilon, and
/// how its gradients reach the FP32 master.
trait Low: AmpElem {
    /// Machine epsilon `ε = 2u`: 2^-10 for FP16, 2^-7 for BF16.
    const EPS: f32;
    /// For messages.
    const NAME: &'static str;

    /// Rounds to the nearest value of this precision (round to nearest, ties to even).
    fn round(x: f32) -> f32;

    /// The master gradients of `model` for the loss that `loss` computes on it. `twin` is a
    /// second copy of the same model, for a second pass that must agree with the first.
    fn master_grads<T>(
        model: &mut T,
        twin: &mut T,
        loss: impl Fn(&mut T) -> Loss<Cpu>,
    ) -> Vec<(String, Vec<f32>)>
    where
        T: TrainTarget<Cpu, Precision = <Self as AmpElem>::Precision>;
}

impl Low for f16 {
    const EPS: f32 = 1.0 / 1024.0;
    const NAME: &'static str = "FP16";

    fn round(x: f32) -> f32 {
        f16::from_f32(x).to_f32()
    }

    /// Through a static loss scaler at [`SCALE`].
    fn master_grads<T>(
        model: &mut T,
        _twin: &mut T,
        loss: impl Fn(&mut T) -> Loss<Cpu>,
    ) -> Vec<(String, Vec<f32>)>
    where
        T: TrainTarget<Cpu, Precision = typed_amp::precision::F16>,
    {
        let scaler = GradScaler::with_static_scale(SCALE).unwrap();
        let grads = scaler.scale(loss(model)).backward().unwrap();
        to_host(scaler.unscale(model, grads).unwrap())
    }
}

impl Low for bf16 {
    const EPS: f32 = 1.0 / 128.0;
    const NAME: &'static str = "BF16";

    fn round(x: f32) -> f32 {
        bf16::from_f32(x).to_f32()
    }

    /// Through the scale-free step, and, on the twin, through a `GradScaler` at scale 1, which
    /// must give the same gradients bit for bit.
    fn master_grads<T>(
        model: &mut T,
        twin: &mut T,
        loss: impl Fn(&mut T) -> Loss<Cpu>,
    ) -> Vec<(String, Vec<f32>)>
    where
        T: TrainTarget<Cpu, Precision = typed_amp::precision::BF16>,
    {
        let raw = loss(model).backward().unwrap();
        let scale_free = to_host(raw.check(model).unwrap());

        let scaler = GradScaler::with_static_scale(1.0).unwrap();
        let grads = scaler.scale(loss(twin)).backward().unwrap();
        assert_eq!(grads.scale(), 1.0);
        let scaled = to_host(scaler.unscale(twin, grads).unwrap());

        assert_eq!(scale_free.len(), scaled.len());
        for ((path, a), (other, b)) in scale_free.iter().zip(&scaled) {
            assert_eq!(path, other);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(a),
                bits(b),
                "`{path}`: the scale-free step and a scaler at scale 1 disagree"
            );
        }
        scale_free
    }
}

/// Rounds every parameter to the nearest value of precision `L`, in place.
struct RoundTo<L>(std::marker::PhantomData<L>);

fn round_to<L>() -> RoundTo<L> {
    RoundTo(std::marker::PhantomData)
}

impl<L: Low> ParamVisitor<Cpu, Mutable> for RoundTo<L> {
    type Error = std::convert::Infallible;
    fn visit<S: Shape, E: AmpElem>(
        &mut self,
        _path: &str,
        param: &mut Tensor<S, E, Cpu>,
        _trainable: bool,
    ) -> Result<(), Self::Error>
    where
        Cpu: typed_amp::device::Kernels<E>,
    {
        let rounded: Vec<E> = param
            .as_vec()
            .into_iter()
            .map(|x| <E as AmpElem>::from_f32(L::round(x.to_f32())))
            .collect();
        param.copy_from(&rounded);
        Ok(())
    }
}

/// Standard normal samples rounded to precision `L`, as FP32.
fn low_values<S: ConstShape, L: Low>(dev: &Cpu) -> Tensor<S, f32, Cpu> {
    let x: Tensor<S, f32, Cpu> = dev.sample_normal();
    let rounded: Vec<f32> = x.as_vec().into_iter().map(L::round).collect();
    dev.tensor_from_vec(rounded, *x.shape())
}

fn one_hot<const B: usize, const C: usize>(dev: &Cpu) -> Tensor<Rank2<B, C>, f32, Cpu> {
    let mut probs = [[0.0f32; C]; B];
    for (i, row) in probs.iter_mut().enumerate() {
        row[(i * 7 + 3) % C] = 1.0;
    }
    dev.tensor(probs)
}

/// Checks every parameter's gradient against the reference within `R·ε·max|g32|` and returns
/// the worst `|g16 − g32| / max|g32|`.
fn assert_close(
    mixed: &[(String, Vec<f32>)],
    reference: &[(String, Vec<f32>)],
    roundings: f32,
    eps: f32,
) -> f32 {
    assert_eq!(mixed.len(), reference.len());
    let mut worst = 0f32;
    for ((path, g16), (ref_path, g32)) in mixed.iter().zip(reference) {
        assert_eq!(path, ref_path);
        let scale = g32.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(scale > 0.0, "`{path}` has an all-zero reference gradient");
        let tolerance = roundings * eps * scale;
        for (a, b) in g16.iter().zip(g32) {
            assert_abs_diff_eq!(*a, *b, epsilon = tolerance);
            worst = worst.max((a - b).abs() / scale);
        }
    }
    worst
}

fn report<L: Low>(graph: &str, worst: f32, roundings: f32) {
    let bound = roundings * L::EPS;
    eprintln!(
        "{graph} in {}: worst |g16 - g32| / max|g32| = {worst:.2e} (bound R·ε = {bound:.2e}; {:.1}% of it)",
        L::NAME,
        100.0 * worst / bound
    );
}

fn to_host<T: TrainTarget<Cpu>, K: StepKind>(
    mut grads: UnscaledGrads<'_, T, Cpu, K>,
) -> Vec<(String, Vec<f32>)> {
    assert!(!grads.found_inf());
    grads.to_host().unwrap()
}

/// The ReLU inputs, as `(sample, unit, FP32 value, 16-bit value)`, that are positive in one
/// forward pass and not in the other; `units` is the layer's width.
fn relu_flips<E: AmpElem>(z32: &[f32], z16: &[E], units: usize) -> Vec<(usize, usize, f32, f32)> {
    z32.iter()
        .zip(z16)
        .enumerate()
        .filter(|(_, (a, b))| (**a > 0.0) != (AmpElem::to_f32(**b) > 0.0))
        .map(|(k, (a, b))| (k / units, k % units, *a, AmpElem::to_f32(*b)))
        .collect()
}

/// The FP32 reference's gradients, through a disabled scaler.
fn reference_grads<T: TrainTarget<Cpu>>(model: &mut T, loss: Loss<Cpu>) -> Vec<(String, Vec<f32>)> {
    let scaler = GradScaler::disabled();
    let grads = scaler.scale(loss).backward().unwrap();
    to_host(scaler.unscale(model, grads).unwrap())
}

/// An MLP of three 16-bit linear layers, `$low` (`f16` or `bf16`).
macro_rules! mlp_graph {
    ($test:ident, $low:ty) => {
        #[test]
        fn $test() {
            let dev = Cpu::seed_from_u64(1);
            type Reference = (Linear<12, 32>, ReLU, Linear<32, 32>, ReLU, Linear<32, 5>);
            let mut master = dev.build_module::<Reference, f32>();
            master.visit_params_mut(&mut round_to::<$low>()).unwrap();
            let pair = || {
                let working = dev.build_module::<Reference, $low>();
                MasterWeights::<_, _, _, <$low as AmpElem>::Precision>::pair(
                    master.clone(),
                    working,
                    &dev,
                )
                .unwrap()
            };
            let (mut mixed, mut twin) = (pair(), pair());
            let mut reference = Fp32Weights::new(master, &dev);

            // A batch on which the FP32 and the 16-bit forward passes take the same ReLU
            // branches (see "Kinks" above); the next one from the same device otherwise.
            let mut rejected = 0;
            let x = loop {
                let x = low_values::<Rank2<16, 12>, $low>(&dev);
                let (r, w) = (reference.working(), mixed.working());
                let z1 = r.0.forward(x.clone());
                let z2 = r.2.forward(z1.clone().relu());
                let y1 = w.0.forward(x.clone().to_dtype::<$low>());
                let y2 = w.2.forward(y1.clone().relu());
                let flips = [
                    relu_flips(&z1.as_vec(), &y1.as_vec(), 32),
                    relu_flips(&z2.as_vec(), &y2.as_vec(), 32),
                ];
                if flips.iter().all(Vec::is_empty) {
                    break x;
                }
                for (layer, (flips, z)) in flips.iter().zip([&z1, &z2]).enumerate() {
                    // A flip is a rounding effect only within the forward error of 0: the
                    // second layer's input has been rounded at most 4 times (each layer's
                    // product and bias sum), so R = 4 bounds both layers.
                    let max = z.as_vec().iter().fold(0f32, |m, v| m.max(v.abs()));
                    for (sample, unit, z32, z16) in flips {
                        assert!(
                            (z32 - z16).abs() <= 4.0 * <$low as Low>::EPS * max,
                            "a ReLU flip beyond rounding: {z32:e} vs {z16:e}"
                        );
                        eprintln!(
                            "MLP in {}: batch {rejected} rejected: layer {}'s ReLU input (sample {sample}, unit {unit}) is {z32:e} in FP32 and {z16:e} in 16 bits",
                            <$low as Low>::NAME,
                            layer + 1
                        );
                    }
                }
                rejected += 1;
                assert!(rejected < 10, "no batch without a ReLU flip in 10 draws");
            };
            let target = one_hot::<16, 5>(&dev);

            let logits = reference
                .working()
                .forward(x.clone().traced_mixed(reference.alloc_grads().unwrap()));
            let loss = cross_entropy_with_logits_loss(logits, target.clone());
            let want = reference_grads(&mut reference, loss);

            let got = <$low as Low>::master_grads(&mut mixed, &mut twin, |m| {
                let grads = m.alloc_grads().unwrap();
                let logits = m
                    .working()
                    .forward(x.clone().to_dtype::<$low>().traced_mixed(grads))
                    .to_f32();
                cross_entropy_with_logits_loss(logits, target.clone())
            });

            // L = 3 16-bit layers: R = 7.
            let worst = assert_close(&got, &want, 7.0, <$low as Low>::EPS);
            report::<$low>("MLP", worst, 7.0);
        }
    };
}

mlp_graph!(mlp_with_fp16_linear_layers, f16);
mlp_graph!(mlp_with_bf16_linear_layers, bf16);

/// 16-bit convolutions (`$low`, entered through the cast layer `$to_low`) around an FP32 batch
/// norm.
macro_rules! cnn_graph {
    ($test:ident, $low:ty, $to_low:ident) => {
        #[test]
        fn $test() {
            let dev = Cpu::seed_from_u64(2);
            // dfdx builds tuples of up to six layers: nest them.
            type Reference = (
                (Conv2D<1, 4, 3, 1, 1>, ReLU, ToF32, BatchNorm2D<4>),
                (ToF32, MaxPool2D<2>, Flatten<{ 4 * 4 * 4 }>, Linear<64, 3>),
            );
            let mut master = dev.build_module::<Reference, f32>();
            master.visit_params_mut(&mut round_to::<$low>()).unwrap();
            let pair = || {
                let working = (
                    (
                        dev.build_module::<Conv2D<1, 4, 3, 1, 1>, $low>(),
                        ReLU,
                        ToF32,
                        dev.build_module::<BatchNorm2D<4>, f32>(),
                    ),
                    (
                        $to_low,
                        MaxPool2D::<2>,
                        Flatten::<64>,
                        dev.build_module::<Linear<64, 3>, $low>(),
                    ),
                );
                MasterWeights::<_, _, _, <$low as AmpElem>::Precision>::pair(
                    master.clone(),
                    working,
                    &dev,
                )
                .unwrap()
            };
            let (mut mixed, mut twin) = (pair(), pair());
            let mut reference = Fp32Weights::new(master, &dev);
            let summary = mixed.working().param_summary();
            assert_eq!(summary[0].dtype, dtype_of::<$low>(), "conv weight");
            assert_eq!(summary[2].dtype, DType::F32, "batch norm scale");
            assert_eq!(
                summary.last().unwrap().dtype,
                dtype_of::<$low>(),
                "linear bias"
            );

            let x = low_values::<Rank4<6, 1, 8, 8>, $low>(&dev);
            let target = one_hot::<6, 3>(&dev);

            let grads = reference.alloc_grads().unwrap();
            let logits = reference
                .working_mut()
                .forward_mut(x.clone().traced_mixed(grads));
            let loss = cross_entropy_with_logits_loss(logits, target.clone());
            let want = reference_grads(&mut reference, loss);

            let got = <$low as Low>::master_grads(&mut mixed, &mut twin, |m| {
                let grads = m.alloc_grads().unwrap();
                let logits = m
                    .working_mut()
                    .forward_mut(x.clone().to_dtype::<$low>().traced_mixed(grads))
                    .to_f32();
                cross_entropy_with_logits_loss(logits, target.clone())
            });

            // Roundings on the conv weight's path: forward, the conv's output, the cast back to
            // 16 bits after batch norm and the linear layer's output; backward, the loss
            // gradient cast into 16 bits, the linear layer's input gradient, batch norm's input
            // gradient cast into 16 bits and the conv's weight gradient. ReLU and
            // non-overlapping max pooling are exact and batch norm runs in FP32, so R = 7, as
            // for three 16-bit layers.
            let worst = assert_close(&got, &want, 7.0, <$low as Low>::EPS);
            report::<$low>("CNN", worst, 7.0);

            // Batch norm trained in FP32 in both models. Its input differs only by the one
            // rounding of the conv's output (relative u = ε/2 per element); after ReLU every
            // element is non-negative, so the batch mean's relative error is at most u too: ε
            // leaves a factor 2. (`mixed` ran one training forward, as the reference did.)
            let (_, working) = mixed.into_parts();
            let running = working.0 .3.running_mean.array();
            let expected = reference.working().0 .3.running_mean.array();
            for (a, b) in running.iter().zip(expected) {
                assert_abs_diff_eq!(*a, b, epsilon = <$low as Low>::EPS * b.abs().max(1e-3));
            }
        }
    };
}

cnn_graph!(cnn_with_fp16_convolutions_and_fp32_batch_norm, f16, ToF16);
cnn_graph!(cnn_with_bf16_convolutions_and_fp32_batch_norm, bf16, ToBf16);

/// Two 16-bit linear layers (`$low`, re-entered through `$to_low`) around an FP32 layer norm,
/// with an FP32 softmax at the end.
macro_rules! layer_norm_graph {
    ($test:ident, $low:ty, $to_low:ident) => {
        #[test]
        fn $test() {
            let dev = Cpu::seed_from_u64(3);
            type Reference = (
                (Linear<10, 24>, ToF32, LayerNorm1D<24>),
                (ToF32, Linear<24, 6>, ToF32, Softmax),
            );
            let mut master = dev.build_module::<Reference, f32>();
            master.visit_params_mut(&mut round_to::<$low>()).unwrap();
            let pair = || {
                let working = (
                    (
                        dev.build_module::<Linear<10, 24>, $low>(),
                        ToF32,
                        dev.build_module::<LayerNorm1D<24>, f32>(),
                    ),
                    (
                        $to_low,
                        dev.build_module::<Linear<24, 6>, $low>(),
                        ToF32,
                        Softmax,
                    ),
                );
                MasterWeights::<_, _, _, <$low as AmpElem>::Precision>::pair(
                    master.clone(),
                    working,
                    &dev,
                )
                .unwrap()
            };
            let (mut mixed, mut twin) = (pair(), pair());
            let mut reference = Fp32Weights::new(master, &dev);

            let x = low_values::<Rank2<8, 10>, $low>(&dev);
            let target = one_hot::<8, 6>(&dev);

            let probs = reference
                .working()
                .forward(x.clone().traced_mixed(reference.alloc_grads().unwrap()));
            let want = reference_grads(&mut reference, mse_loss(probs, target.clone()));

            let got = <$low as Low>::master_grads(&mut mixed, &mut twin, |m| {
                let grads = m.alloc_grads().unwrap();
                let probs = m
                    .working()
                    .forward(x.clone().to_dtype::<$low>().traced_mixed(grads));
                mse_loss(probs, target.clone())
            });

            // Roundings on the first layer's path: forward, its output, the cast back to 16
            // bits after layer norm and the second layer's output; backward, softmax's input
            // gradient cast into 16 bits, the second layer's input gradient, layer norm's input
            // gradient cast into 16 bits and the first layer's weight gradient. Layer norm and
            // softmax run in FP32: R = 7.
            let worst = assert_close(&got, &want, 7.0, <$low as Low>::EPS);
            report::<$low>("LayerNorm/softmax", worst, 7.0);
        }
    };
}

layer_norm_graph!(
    layer_norm_and_softmax_in_fp32_between_fp16_layers,
    f16,
    ToF16
);
layer_norm_graph!(
    layer_norm_and_softmax_in_fp32_between_bf16_layers,
    bf16,
    ToBf16
);
