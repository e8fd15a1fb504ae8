use typed_amp::amp::AmpModel;
use typed_amp::dfdx::nn::builders::{BatchNorm1D, LayerNorm1D};
use typed_amp::prelude::*;

/// A block with its own policy, nested in other models.
#[typed_amp::amp(policy = "O2")]
pub struct Block {
    fc: Linear<8, 8>,
    norm: LayerNorm1D<8>,
    act: ReLU,
}

#[typed_amp::amp(policy = "O2", loss_scale = 1024.0, cast_model_outputs = "fp32")]
pub struct Net {
    stem: (Linear<4, 8>, ReLU),
    block: Block,
    bn: BatchNorm1D<8>,
    #[amp(fp32)]
    head: Linear<8, 2>,
    probs: Softmax,
}

#[typed_amp::amp(policy = "O2", keep_batchnorm_fp32 = false)]
pub struct AllHalf {
    fc: Linear<4, 4>,
    bn: BatchNorm1D<4>,
}

#[typed_amp::amp(policy = "O3", master_weights = true)]
pub struct PureHalfWithMaster {
    fc: Linear<4, 4>,
}

#[typed_amp::amp(policy = "O1", custom_forward)]
pub struct Custom {
    fc: Linear<4, 4>,
}

fn main() {
    let dev = Cpu::default();
    let net = Net::build(&dev).unwrap();
    let x: Tensor<Rank2<3, 4>, f32, _> = dev.zeros();
    let y: Tensor<Rank2<3, 2>, f32, _> = net.working().forward(x);
    let _ = y;
    assert_eq!(Net::scaler().get_scale(), 1024.0);
    let _ = AllHalf::build(&dev).unwrap();
    let _ = PureHalfWithMaster::build(&dev).unwrap();
    let _ = <Custom as AmpModel<Cpu>>::CONFIG;
}

/// A type alias hides the layer's name; a pin says what it is.
type Hidden = Linear<4, 4>;

#[typed_amp::amp(policy = "O2")]
pub struct PinnedAlias {
    #[amp(fp16)]
    fc: Hidden,
}

#[allow(dead_code)]
fn pinned_alias_builds() {
    let _ = PinnedAlias::build(&Cpu::default()).unwrap();
}
