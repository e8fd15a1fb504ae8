use typed_amp::device::{AmpDevice, Kernels};
use typed_amp::params::{ParamVisitor, Parameters};
use typed_amp::precision::AmpElem;
use typed_amp::prelude::*;

/// Reads every parameter: a `ParamVisitor<D>`, by shared reference.
struct Count(usize);

impl<D: AmpDevice> ParamVisitor<D> for Count {
    type Error = AmpError;
    fn visit<S: Shape, E: AmpElem>(
        &mut self,
        _path: &str,
        _param: &Tensor<S, E, D>,
        _trainable: bool,
    ) -> Result<(), AmpError>
    where
        D: Kernels<E>,
    {
        self.0 += 1;
        Ok(())
    }
}

fn main() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let mut layer = dev.build_module::<Linear<3, 2>, f32>();
    // Wrong: a walk by `&mut` hands each parameter over mutably, to a `ParamVisitor<D, Mutable>`.
    Parameters::<Cpu>::visit_params_mut(&mut layer, &mut Count(0))?;
    Ok(())
}
