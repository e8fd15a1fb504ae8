//! Layers by trait: an `#[amp]` model whose fields are a type alias, an `Embedding`, a
//! `Repeated` block, a `Residual` block (with an FP32 layer norm inside an FP16 block), a
//! `Repeated` block of another `#[amp]` model and a user's own layer trains under O2 without a
//! single pin, each layer in the precision its `AmpLayer` row gives it, and ends as close to
//! the same model under O0 as the MLP and CNN of `amp_policies.rs` do.

use rand::{rngs::StdRng, Rng, SeedableRng};
use typed_amp::amp::{kind, AmpLayer, AmpModel};
use typed_amp::device::Kernels;
use typed_amp::dfdx::losses;
use typed_amp::dfdx::nn::modules::{
    Embedding as EmbeddingModule, LayerNorm1D as LayerNormModule, Linear as LinearModule,
};
use typed_amp::dfdx::nn::{BuildModule, BuildOnDevice, ModuleVisitor, NonMutableModule};
use typed_amp::dfdx::nn::{TensorCollection, TensorOptions};
use typed_amp::params::{visit_collection, visit_collection_mut, ParamPath};
use typed_amp::params::{Mutable, ParamVisitor};
use typed_amp::prelude::*;
use typed_amp::{device::AmpDevice, params::Parameters, tape::MixedTape};
use typed_amp::{optim::MasterOptimizer, precision::AmpElem};

use crate::common;
use common::param_bytes;

const VOCAB: usize = 24;
const WIDTH: usize = 16;
const CLASSES: usize = 4;
const BATCH: usize = 16;
const SEQ: usize = 8;
const STEPS: usize = 150;

/// A user's layer: a learned gain per feature (a "layer scale"), written as any dfdx layer is,
/// plus one line saying which row of the policy table it is in.
pub mod gate {
    use super::*;

    /// The architecture: builds a [`GateLayer`].
    #[derive(Debug)]
    pub struct Gate<const M: usize>;

    /// The layer: `x * gain`, the gain broadcast over every axis but the last.
    #[derive(Debug, Clone)]
    pub struct GateLayer<const M: usize, E: Dtype, D: Storage<E>> {
        pub gain: Tensor<Rank1<M>, E, D>,
    }

    impl<const M: usize, E: Dtype, D: Device<E>> BuildOnDevice<D, E> for Gate<M>
    where
        GateLayer<M, E, D>: BuildModule<D, E>,
    {
        type Built = GateLayer<M, E, D>;
    }

    impl<const M: usize, E: Dtype, D: Device<E>> TensorCollection<E, D> for GateLayer<M, E, D> {
        type To<E2: Dtype, D2: Device<E2>> = GateLayer<M, E2, D2>;

        fn iter_tensors<V: ModuleVisitor<Self, E, D>>(
            visitor: &mut V,
        ) -> Result<Option<Self::To<V::E2, V::D2>>, V::Err> {
            visitor.visit_fields(
                Self::tensor(
                    "gain",
                    |s| &s.gain,
                    |s| &mut s.gain,
                    TensorOptions::reset_to_ones(),
                ),
                |gain| GateLayer { gain },
            )
        }
    }

    impl<const M: usize, E: Dtype, D: Storage<E>> NonMutableModule for GateLayer<M, E, D> {}

    impl<B: Dim, S: Dim, const M: usize, E: Dtype, D: Device<E>, T: Tape<E, D>>
        Module<Tensor<(B, S, Const<M>), E, D, T>> for GateLayer<M, E, D>
    {
        type Output = Tensor<(B, S, Const<M>), E, D, T>;
        type Error = D::Err;

        fn try_forward(
            &self,
            x: Tensor<(B, S, Const<M>), E, D, T>,
        ) -> Result<Self::Output, D::Err> {
            let shape = *x.shape();
            x.try_mul(self.gain.retaped::<T>().try_broadcast_like(&shape)?)
        }
    }

    impl<const M: usize, E: AmpElem, D: AmpDevice + Kernels<E>> Parameters<D> for GateLayer<M, E, D> {
        fn visit_params_at<V: ParamVisitor<D>>(
            &self,
            path: &mut ParamPath,
            visitor: &mut V,
        ) -> Result<(), V::Error> {
            visit_collection::<Self, E, D, V>(self, path, visitor)
        }

        fn visit_params_mut_at<V: ParamVisitor<D, Mutable>>(
            &mut self,
            path: &mut ParamPath,
            visitor: &mut V,
        ) -> Result<(), V::Error> {
            visit_collection_mut::<Self, E, D, V>(self, path, visitor)
        }
    }

    // The one line `#[amp]` needs: a gain follows the model's storage precision.
    impl<const M: usize, E: Dtype, D: Storage<E>> AmpLayer for GateLayer<M, E, D> {
        type Kind = kind::Elementwise;
    }
}

use gate::Gate;

/// A type alias: `#[amp]` cannot see that it is a linear layer, and does not need to.
type Hidden = Linear<WIDTH, WIDTH>;

macro_rules! tagger {
    ($name:ident, $block:ident, $($policy:tt)*) => {
        /// A block that is itself an `#[amp]` model, repeated inside the tagger.
        #[typed_amp::amp($($policy)*)]
        pub struct $block {
            fc: Hidden,
            act: Tanh,
        }

        /// Tags each token of a sequence with one of `CLASSES` classes.
        #[typed_amp::amp($($policy)*, cast_model_outputs = "fp32")]
        pub struct $name {
            embed: Embedding<VOCAB, WIDTH>,
            mlp: Repeated<(Hidden, ReLU), 2>,
            res: Residual<(Hidden, LayerNorm1D<WIDTH>)>,
            blocks: Repeated<$block, 2>,
            gate: Gate<WIDTH>,
            head: Linear<WIDTH, CLASSES>,
        }
    };
}

tagger!(TaggerO0, BlockO0, policy = "O0");
tagger!(TaggerO2, BlockO2, policy = "O2");

type Tokens<T = NoneTape> = Tensor<Rank2<BATCH, SEQ>, usize, Cpu, T>;
type Logits<T = NoneTape> = Tensor<Rank3<BATCH, SEQ, CLASSES>, f32, Cpu, T>;
type Batch = (Tokens, Tensor<Rank3<BATCH, SEQ, CLASSES>, f32, Cpu>);

/// Token sequences whose tags are a fixed function of the token, one in five tags replaced at
/// random so that the loss has a floor above zero.
fn batches(dev: &Cpu, n: usize, seed: u64) -> Vec<Batch> {
    let table: Vec<usize> = (0..VOCAB).map(|t| (t * 7 + 3) % CLASSES).collect();
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let tokens: Vec<usize> = (0..BATCH * SEQ).map(|_| rng.gen_range(0..VOCAB)).collect();
            let mut tags = vec![0.0f32; BATCH * SEQ * CLASSES];
            for (i, &t) in tokens.iter().enumerate() {
                let class = if rng.gen_bool(0.2) {
                    rng.gen_range(0..CLASSES)
                } else {
                    table[t]
                };
                tags[i * CLASSES + class] = 1.0;
            }
            (
                dev.tensor_from_vec(tokens, (Const, Const)),
                dev.tensor_from_vec(tags, (Const, Const, Const)),
            )
        })
        .collect()
}

type WorkingOf<M> = typed_amp::amp::WorkingOf<M, Cpu>;
type MasterOf<M> = typed_amp::amp::MasterOf<M, Cpu>;

fn adam() -> AdamConfig {
    AdamConfig {
        lr: 1e-2,
        ..Default::default()
    }
}

/// The mean cross-entropy of `model` on `batches`.
fn mean_loss<M>(model: &M::Weights, batches: &[Batch]) -> f32
where
    M: AmpModel<Cpu>,
    WorkingOf<M>: Module<Tokens, Output = Logits>,
{
    let total: f32 = batches
        .iter()
        .map(|(x, y)| {
            let logits = model.working().try_forward(x.clone()).unwrap();
            losses::cross_entropy_with_logits_loss(logits, y.clone()).array()
        })
        .sum();
    total / batches.len() as f32
}

/// Trains `STEPS` Adam steps with the model's own scaler; returns (held-out loss before,
/// held-out loss after, how many master parameters the training changed, how many there are).
fn train<M, O>(optimizer: impl FnOnce(&MasterOf<M>) -> O) -> (f32, f32, usize, usize)
where
    M: AmpModel<Cpu>,
    O: MasterOptimizer<MasterOf<M>, Cpu>,
    WorkingOf<M>: ModuleMut<Tokens<MixedTape<Cpu>>, Output = Logits<MixedTape<Cpu>>>
        + Module<Tokens, Output = Logits>,
{
    let dev = Cpu::seed_from_u64(11);
    let data = batches(&dev, 30, 5);
    let held_out = batches(&dev, 10, 6);
    let mut model = M::try_build(&dev).unwrap();
    let before_params = param_bytes(model.master());
    let before = mean_loss::<M>(&model, &held_out);
    let mut opt = optimizer(model.master());
    let mut scaler = M::scaler();
    let mut grads = model.alloc_grads().unwrap();
    for step in 0..STEPS {
        let (x, y) = &data[step % data.len()];
        let logits = model
            .working_mut()
            .try_forward_mut(x.clone().traced_mixed(grads))
            .unwrap();
        let loss = cross_entropy_with_logits_loss(logits, y.clone());
        let scaled = scaler.scale(loss).backward().unwrap();
        let unscaled = scaler.unscale(&mut model, scaled).unwrap();
        let outcome = scaler.step(&mut opt, unscaled).unwrap();
        assert!(!outcome.skipped(), "{}: step {step} skipped", M::CONFIG);
        grads = scaler.update(outcome).unwrap();
    }
    let after_params = param_bytes(model.master());
    let changed = before_params
        .iter()
        .zip(&after_params)
        .filter(|(a, b)| a.2 != b.2)
        .count();
    (
        before,
        mean_loss::<M>(&model, &held_out),
        changed,
        after_params.len(),
    )
}

#[test]
fn o2_gives_each_layer_its_rows_precision_without_pins() {
    let model = TaggerO2::build(&Cpu::default()).unwrap();
    let working = model.working();
    let _: &EmbeddingModule<VOCAB, WIDTH, f16, Cpu> = &working.embed;
    let _: &LinearModule<WIDTH, WIDTH, f16, Cpu> = &working.mlp.modules[1].0;
    let _: &LinearModule<WIDTH, WIDTH, f16, Cpu> = &working.res.0 .0;
    // Layer norm stays FP32 under O2 (`keep_batchnorm_fp32`), inside an FP16 residual block.
    let _: &LayerNormModule<WIDTH, f32, Cpu> = &working.res.0 .1;
    let _: &LinearModule<WIDTH, WIDTH, f16, Cpu> = &working.blocks.modules[0].fc;
    let _: &gate::GateLayer<WIDTH, f16, Cpu> = &working.gate;
    let _: &LinearModule<WIDTH, CLASSES, f16, Cpu> = &working.head;
    let _: &LinearModule<WIDTH, WIDTH, f32, Cpu> = &model.master().res.0 .0;
    // Parameter paths follow the structure: tuples and repeats by index, fields by name.
    let paths: Vec<String> = model
        .master()
        .param_summary()
        .into_iter()
        .map(|p| p.path)
        .collect();
    for path in [
        "embed.weight",
        "mlp.1.0.weight",
        "res.0.1.gamma",
        "blocks.1.fc.bias",
        "gate.gain",
        "head.weight",
    ] {
        assert!(paths.iter().any(|p| p == path), "{path} not in {paths:?}");
    }
}

#[test]
fn aliases_repeats_residuals_embeddings_and_user_layers_train_under_o2() {
    let (before, o2, changed, total) = train::<TaggerO2, _>(|m| typed_amp::optim::adam(m, adam()));
    // Every master parameter moved: gradients reached the embedding through the token ids'
    // tape, every repeat, both residual paths, the nested models and the user's layer.
    assert_eq!(
        changed, total,
        "O2 changed only {changed} of {total} parameters"
    );
    // The task's floor is far below the untrained loss (ln 4 = 1.39 for uniform logits): the
    // model learned the tags.
    assert!(o2 < 0.6 * before, "O2 held-out loss {o2} from {before}");
    let (_, o0, changed, total) = train::<TaggerO0, _>(|m| typed_amp::optim::adam(m, adam()));
    assert_eq!(changed, total);
    // The acceptance bound of the policy tests (`amp_policies.rs`): within 2% of O0.
    let gap = (o2 - o0).abs() / o0;
    println!(
        "held-out loss: untrained {before:.4}, O0 {o0:.4}, O2 {o2:.4} ({:.2}% apart)",
        100.0 * gap
    );
    assert!(gap < 0.02, "O2 {o2} vs O0 {o0}: {:.2}% apart", 100.0 * gap);
}
