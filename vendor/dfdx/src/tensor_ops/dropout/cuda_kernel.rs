use crate::{
    dtypes::*,
    shapes::*,
    tensor::{launch_cfg, Cuda, Tensor},
};

use cudarc::driver::{DeviceSlice, LaunchAsync};

use rand_distr::Bernoulli;

/// typed-amp patch: the kernels draw the mask themselves (see `dropout.cu`): an element is dropped
/// when its 64-bit draw is below this threshold, `p · 2^64` as rand_distr's `Bernoulli` computes
/// it (`u64::MAX` for `p = 1`: everything is dropped). Before, the host drew the mask with
/// `StdRng` and copied it to a new device buffer in every forward and every backward; the masks
/// now differ from the CPU's for the same seed (each is a Bernoulli(p) draw per element, and
/// forward and backward still agree).
///
/// # Panics
/// If `prob` is not in `[0, 1]`, as `Bernoulli::new(prob).unwrap()` did.
fn drop_threshold(prob: f64) -> u64 {
    Bernoulli::new(prob).unwrap();
    if prob == 1.0 {
        u64::MAX
    } else {
        // rand_distr 0.4's `Bernoulli::new`: `(p * SCALE) as u64`, SCALE = 2^64.
        (prob * 2.0 * (1u64 << 63) as f64) as u64
    }
}

const PTX_SRC: &str = include_str!(concat!(env!("OUT_DIR"), "/dropout.ptx"));

trait HasCudaKernel<E> {
    const MOD: &'static str;
    const FNS: &'static [&'static str];
}

#[cfg(feature = "f16")]
impl HasCudaKernel<f16> for Cuda {
    const MOD: &'static str = "dropout_f16";
    const FNS: &'static [&'static str] = &["dropout_fwd_f16", "dropout_bwd_f16"];
}
// typed-amp patch: bf16
#[cfg(feature = "f16")]
impl HasCudaKernel<bf16> for Cuda {
    const MOD: &'static str = "dropout_bf16";
    const FNS: &'static [&'static str] = &["dropout_fwd_bf16", "dropout_bwd_bf16"];
}

#[cfg(feature = "f16")]
impl HasCudaKernel<AMP<f16>> for Cuda {
    const MOD: &'static str = "dropout_f16";
    const FNS: &'static [&'static str] = &["dropout_fwd_f16", "dropout_bwd_f16"];
}

impl HasCudaKernel<f32> for Cuda {
    const MOD: &'static str = "dropout_f32";
    const FNS: &'static [&'static str] = &["dropout_fwd_f32", "dropout_bwd_f32"];
}

impl HasCudaKernel<f64> for Cuda {
    const MOD: &'static str = "dropout_f64";
    const FNS: &'static [&'static str] = &["dropout_fwd_f64", "dropout_bwd_f64"];
}

impl<E: Dtype> super::DropoutKernel<E> for Cuda
where
    Self: HasCudaKernel<E>,
{
    fn forward<S: Shape>(
        &self,
        op: super::DropoutKernelOp,
        inp: &Tensor<S, E, Self>,
    ) -> Result<Tensor<S, E, Self>, Self::Err> {
        let threshold = drop_threshold(op.prob);
        let prob = E::from_f64(op.prob).unwrap();

        if !self.dev.has_func(Self::MOD, Self::FNS[0]) {
            self.dev.load_ptx(PTX_SRC.into(), Self::MOD, Self::FNS)?;
        }

        let numel = inp.data.len();
        let mut storage = unsafe { self.alloc_empty::<E>(numel) }?;

        let fwd_fn = self.dev.get_func(Self::MOD, Self::FNS[0]).unwrap();
        let cfg = launch_cfg::<128>(numel as u32);
        let params = (
            prob,
            numel,
            inp.data.as_ref(),
            op.seed,
            threshold,
            &mut storage,
        );
        unsafe { fwd_fn.launch(cfg, params) }?;
        Ok(self.build_tensor(inp.shape, inp.strides, storage))
    }
    fn backward<S: Shape>(
        &self,
        op: super::DropoutKernelOp,
        inp: &Tensor<S, E, Self>,
        grad_inp: &mut Self::Vec,
        grad_out: &Self::Vec,
    ) -> Result<(), Self::Err> {
        let threshold = drop_threshold(op.prob);
        let prob = E::from_f64(op.prob).unwrap();
        let bwd_fn = self.dev.get_func(Self::MOD, Self::FNS[1]).unwrap();
        let numel = inp.data.len();
        let cfg = launch_cfg::<128>(numel as u32);
        let params = (prob, numel, op.seed, threshold, grad_inp, grad_out);
        unsafe { bwd_fn.launch(cfg, params) }?;
        Ok(())
    }
}
