use typed_amp::master::{Fp32Weights, WorkingCopy};
use typed_amp::{params::ParamInfo, tape::MixedGradients};
use typed_amp::prelude::*;
use typed_amp::tape::TargetId;

type Net = (Linear<4, 2>,);
type Inner = Fp32Weights<<Net as BuildOnDevice<Cpu, f32>>::Built, Cpu>;

/// Wrong: a hand-written training target, which could declare any precision over any weights
/// (here BF16 over FP32 weights). `TrainTarget` is sealed: only the library's targets are.
struct Forged(Inner);

impl TrainTarget<Cpu> for Forged {
    type Master = <Inner as TrainTarget<Cpu>>::Master;
    type Working = <Inner as TrainTarget<Cpu>>::Working;
    type Precision = BF16;
    fn master(&self) -> &Self::Master {
        self.0.master()
    }
    fn master_mut(&mut self) -> &mut Self::Master {
        self.0.master_mut()
    }
    fn working(&self) -> &WorkingCopy<Self::Working> {
        self.0.working()
    }
    fn working_mut(&mut self) -> &mut WorkingCopy<Self::Working> {
        self.0.working_mut()
    }
    fn id(&self) -> TargetId {
        self.0.id()
    }
    fn layout(&self) -> &[ParamInfo] {
        self.0.layout()
    }
    fn unscale_into_master(
        &mut self,
        working: &mut MixedGradients<Cpu>,
        inv_scale: f32,
    ) -> Result<(MixedGradients<Cpu>, Vec<bool>), AmpError> {
        self.0.unscale_into_master(working, inv_scale)
    }
    fn recycle(
        &mut self,
        master_grads: MixedGradients<Cpu>,
        working: MixedGradients<Cpu>,
    ) -> Result<MixedGradients<Cpu>, AmpError> {
        self.0.recycle(master_grads, working)
    }
    fn refresh(&mut self) -> Result<(), AmpError> {
        self.0.refresh()
    }
    fn sync_buffers_to_master(&mut self) -> Result<(), AmpError> {
        self.0.sync_buffers_to_master()
    }
    fn reload_working(&mut self) -> Result<(), AmpError> {
        self.0.reload_working()
    }
}

fn main() {}
