//! Reproduces PyTorch's `GradScaler` bit for bit: the reference trace in
//! `../shared/reference/gradscaler_torch_cpu_trace.json` records, step by step, the scale, the
//! growth tracker, skipped steps, the scaled and unscaled gradients and the parameter after SGD.
//! The same program runs here through typed-amp's typed step, and every number must match exactly
//! (all values are exact in FP32, so no tolerance applies).

use std::path::PathBuf;

use serde_json::Value;
use typed_amp::dfdx::optim::Sgd;
use typed_amp::loss::Loss;
use typed_amp::master::Fp32Weights;
use typed_amp::prelude::*;

fn trace_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("shared")
        .join("reference")
        .join("gradscaler_torch_cpu_trace.json")
}

fn number(v: &Value) -> f32 {
    match v {
        Value::Number(n) => n.as_f64().expect("a JSON number") as f32,
        Value::String(s) if s == "inf" => f32::INFINITY,
        Value::String(s) if s == "-inf" => f32::NEG_INFINITY,
        Value::String(s) if s == "nan" => f32::NAN,
        other => panic!("not a number in the trace: {other}"),
    }
}

fn numbers(v: &Value) -> [f32; 4] {
    let items = v.as_array().expect("a JSON array");
    assert_eq!(items.len(), 4);
    [0, 1, 2, 3].map(|i| number(&items[i]))
}

/// Bit-for-bit equality, with every NaN equal to every NaN.
fn assert_bits(step: u64, what: &str, got: [f32; 4], want: [f32; 4]) {
    let same = got
        .iter()
        .zip(&want)
        .all(|(g, w)| g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()));
    assert!(same, "step {step}: {what} is {got:?}, PyTorch has {want:?}");
}

fn replay(trace: &Value) {
    let rows = trace["rows"].as_array().expect("rows");
    let dev = Cpu::default();
    let p0: Tensor<Rank1<4>, f32, Cpu> = dev.tensor([1.0, -2.0, 0.5, 3.0]);
    let mut model = Fp32Weights::new(p0, &dev);
    let mut opt = Sgd::new(
        model.master(),
        SgdConfig {
            lr: 0.1,
            momentum: None,
            weight_decay: None,
        },
    );
    let mut scaler = GradScaler::new(65536.0, 2.0, 0.5, 3).unwrap();
    let mut grads = model.alloc_grads().unwrap();

    for row in rows {
        let step = row["step"].as_u64().unwrap();
        let inf = row["inf_injected"].as_bool().unwrap();
        assert_eq!(
            scaler.get_scale(),
            number(&row["scale_before"]),
            "step {step}: scale"
        );

        let w = [1.0, if inf { f32::INFINITY } else { 0.5 }, -0.25, 2.0];
        let w: Tensor<Rank1<4>, f32, Cpu> = dev.tensor(w);
        let p = model.working().clone().into_inner().traced_mixed(grads);
        let loss = Loss::new((p * w).sum());

        let scaled = scaler.scale(loss).backward().unwrap();
        let grad_scaled = scaled.grads().get(model.working()).unwrap().array();
        assert_bits(
            step,
            "scaled gradient",
            grad_scaled,
            numbers(&row["grad_scaled"]),
        );

        let unscaled = scaler.unscale(&mut model, scaled).unwrap();
        let grad_unscaled = unscaled.get(unscaled.target().master()).unwrap().array();
        assert_bits(
            step,
            "unscaled gradient",
            grad_unscaled,
            numbers(&row["grad_unscaled"]),
        );

        let outcome = scaler.step(&mut opt, unscaled).unwrap();
        assert_eq!(
            outcome.skipped(),
            row["skipped"].as_bool().unwrap(),
            "step {step}: skipped"
        );
        assert_bits(
            step,
            "parameter",
            model.master().array(),
            numbers(&row["p_after"]),
        );

        grads = scaler.update(outcome).unwrap();
        assert_eq!(
            scaler.get_scale(),
            number(&row["scale_after_update"]),
            "step {step}: scale after update"
        );
        assert_eq!(
            u64::from(scaler.growth_tracker()),
            row["growth_tracker_after"].as_u64().unwrap(),
            "step {step}: growth tracker"
        );
    }
    assert_eq!(
        scaler.skipped_steps(),
        rows.iter()
            .filter(|r| r["skipped"].as_bool() == Some(true))
            .count() as u64
    );
}

#[test]
fn reproduces_pytorch_gradscaler_bit_for_bit() {
    let path = trace_path();
    let Ok(text) = std::fs::read_to_string(&path) else {
        eprintln!(
            "skipping: PyTorch reference trace not found at {} (it ships in ../shared/reference)",
            path.display()
        );
        return;
    };
    let reference: Value = serde_json::from_str(&text).expect("the trace is valid JSON");
    // The two traces differ only in how steps are numbered; both must replay.
    replay(&reference["trace_1based"]);
    replay(&reference["trace_0based"]);
}
