use typed_amp::prelude::*;

fn main() -> Result<(), AmpError> {
    let mut scaler = GradScaler::default();
    // Wrong: a flag the caller supplies can be wrong (`false` after an overflow); `update` takes
    // what `scaler.step(..)` returned.
    scaler.update(false)?;
    Ok(())
}
