use typed_amp::prelude::*;

fn main() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let master = dev.build_module::<Linear<4, 2>, f32>();
    let working = master.clone();
    // Wrong: a working copy is 16-bit; an FP32 model needs no master copy (`Fp32Weights`).
    let _model = MasterWeights::<_, _, _, F32>::pair(master, working, &dev)?;
    Ok(())
}
