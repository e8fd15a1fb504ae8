use typed_amp::dfdx::nn::builders::{
    AccurateGeLU, LayerNorm1D, Repeated, Residual, UnbiasedLinear,
};
use typed_amp::nn::builders::{CausalSelfAttention, TokenEmbedding};
use typed_amp::ops::lm_head::try_lm_head_loss;
use typed_amp::prelude::*;

type Block = (
    Residual<(LayerNorm1D<32>, CausalSelfAttention<32, 4, 96>)>,
    Residual<(
        LayerNorm1D<32>,
        UnbiasedLinear<32, 128>,
        AccurateGeLU,
        UnbiasedLinear<128, 32>,
    )>,
);

#[typed_amp::amp(policy = "O0")]
struct TinyGpt {
    embed: TokenEmbedding<16, 8, 32>,
    blocks: Repeated<Block, 2>,
    norm: LayerNorm1D<32>,
}

#[test]
fn tiny_gpt_trains() {
    let dev = Cpu::default();
    let mut model = TinyGpt::build(&dev).unwrap();
    let mut opt = typed_amp::optim::adam(model.master(), AdamConfig::default());
    let mut scaler = TinyGpt::scaler();
    let mut grads = model.alloc_grads().unwrap();
    let mut first = None;
    let mut last = 0.0;
    for _ in 0..60 {
        let ids: Vec<usize> = (0..4 * 8).map(|i| (i * 3 + i / 8) % 16).collect();
        let tgt: Vec<usize> = (0..4 * 8).map(|i| ((i + 1) * 3 + i / 8) % 16).collect();
        let x: Tensor<(usize, usize), usize, Cpu> = dev.tensor_from_vec(ids, (4, 8));
        let y: Tensor<(usize, usize), usize, Cpu> = dev.tensor_from_vec(tgt, (4, 8));
        let h = model.working_mut().forward_mut(x.traced_mixed(grads));
        let loss = try_lm_head_loss(h, &model.working().embed.wte, &y).unwrap();
        last = loss.value();
        first.get_or_insert(last);
        let scaled = scaler.scale(loss).backward().unwrap();
        let mut unscaled = scaler.unscale(&mut model, scaled).unwrap();
        clip_grad_norm(&mut unscaled, 1.0).unwrap();
        let outcome = scaler.step(&mut opt, unscaled).unwrap();
        grads = scaler.update(outcome).unwrap();
    }
    println!("loss {:?} -> {last}", first);
    assert!(last < first.unwrap() * 0.5);
}
