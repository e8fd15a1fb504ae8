//! Nobody reads the gradient of a model's input, so the first linear layer skips computing it
//! (as PyTorch does for inputs that do not require gradients): gradients that keep only the
//! parameters' (`MixedGradients::for_params`) mark the traced input, and casts of it, as
//! unwanted. Skipping must not change any parameter's gradient, and gradients that keep
//! everything (`MixedGradients::leaky`) must still hold the input's.

use typed_amp::dfdx::nn::builders::Linear;
use typed_amp::loss::cross_entropy_with_logits_loss;
use typed_amp::loss::Loss;
use typed_amp::nn::builders::{ToF16, ToF32};
use typed_amp::prelude::*;
use typed_amp::{precision::AmpElem, step::ScaledGrads, tape::MixedGradients};

type Mlp = (Linear<12, 32>, ReLU, Linear<32, 5>);

fn one_hot(dev: &Cpu) -> Tensor<Rank2<16, 5>, f32, Cpu> {
    let mut probs = [[0.0f32; 5]; 16];
    for (i, row) in probs.iter_mut().enumerate() {
        row[(i * 3 + 1) % 5] = 1.0;
    }
    dev.tensor(probs)
}

fn backward(loss: Loss<Cpu>) -> ScaledGrads<Cpu> {
    GradScaler::disabled().scale(loss).backward().unwrap()
}

fn bits<S: Shape, E: AmpElem>(grad: Option<Tensor<S, E, Cpu>>) -> Vec<u32>
where
    Cpu: Device<E>,
{
    let grad = grad.expect("a parameter's gradient is missing");
    grad.as_vec()
        .iter()
        .map(|x| AmpElem::to_f32(*x).to_bits())
        .collect()
}

/// Every parameter's gradient, bit for bit, from both runs.
fn assert_same_param_grads<E: AmpElem>(
    model: &(
        dfdx::nn::modules::Linear<12, 32, E, Cpu>,
        ReLU,
        dfdx::nn::modules::Linear<32, 5, E, Cpu>,
    ),
    skipped: &MixedGradients<Cpu>,
    kept: &MixedGradients<Cpu>,
) where
    Cpu: Device<E>,
{
    assert_eq!(
        bits(skipped.get(&model.0.weight)),
        bits(kept.get(&model.0.weight))
    );
    assert_eq!(
        bits(skipped.get(&model.0.bias)),
        bits(kept.get(&model.0.bias))
    );
    assert_eq!(
        bits(skipped.get(&model.2.weight)),
        bits(kept.get(&model.2.weight))
    );
    assert_eq!(
        bits(skipped.get(&model.2.bias)),
        bits(kept.get(&model.2.bias))
    );
}

#[test]
fn fp32_first_layer_skips_the_input_gradient_and_nothing_else() {
    let dev = Cpu::seed_from_u64(7);
    let model = dev.build_module::<Mlp, f32>();
    let x: Tensor<Rank2<16, 12>, f32, Cpu> = dev.sample_normal();
    let target = one_hot(&dev);

    let params_only = MixedGradients::for_params(&model).unwrap();
    let logits = model.forward(x.clone().traced_mixed(params_only));
    let skipped = backward(cross_entropy_with_logits_loss(logits, target.clone()));
    assert!(
        skipped.grads().get(&x).is_none(),
        "the input's gradient was kept"
    );

    let logits = model.forward(x.clone().traced_mixed(MixedGradients::leaky()));
    let kept = backward(cross_entropy_with_logits_loss(logits, target.clone()));
    assert_same_param_grads(&model, skipped.grads(), kept.grads());

    // The input's gradient, where it is wanted, is dfdx's own.
    let logits = model.forward(x.leaky_trace());
    let reference = typed_amp::dfdx::losses::cross_entropy_with_logits_loss(logits, target)
        .backward()
        .get(&x)
        .as_vec();
    let got = kept
        .grads()
        .get(&x)
        .expect("leaky gradients lost the input's")
        .as_vec();
    for (a, b) in got.iter().zip(&reference) {
        approx::assert_relative_eq!(*a, *b, max_relative = 1e-6, epsilon = 1e-9);
    }
}

#[test]
fn fp16_first_layer_skips_the_gradient_of_the_cast_input() {
    let dev = Cpu::seed_from_u64(8);
    let model = dev.build_module::<Mlp, f16>();
    let cast_in = dev.build_module::<ToF16, f32>();
    let cast_out = dev.build_module::<ToF32, f32>();
    let x: Tensor<Rank2<16, 12>, f32, Cpu> = dev.sample_normal();
    let target = one_hot(&dev);

    let run = |grads: MixedGradients<Cpu>| {
        let h = cast_in.forward(x.clone().traced_mixed(grads));
        let logits = cast_out.forward(model.forward(h));
        backward(cross_entropy_with_logits_loss(logits, target.clone()))
    };
    let skipped = run(MixedGradients::for_params(&model).unwrap());
    let kept = run(MixedGradients::leaky());
    assert!(skipped.grads().get(&x).is_none());
    let input_grad = kept
        .grads()
        .get(&x)
        .expect("leaky gradients lost the input's");
    assert!(input_grad.as_vec().iter().any(|g| *g != 0.0));
    assert_same_param_grads(&model, skipped.grads(), kept.grads());
}
