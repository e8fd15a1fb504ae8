//! One model with FP16, BF16 and FP32 layers, joined by explicit cast layers: it trains behind
//! FP32 master weights with a loss scaler (FP16 anywhere needs one), each working parameter in
//! its own precision. Declaring such a working copy BF16, which would let it step without a
//! scaler, is refused by name.

use typed_amp::dfdx::nn::builders::Linear;
use typed_amp::dfdx::optim::Adam;
use typed_amp::nn::builders::{ToBf16, ToF32};
use typed_amp::params::Parameters;
use typed_amp::prelude::*;
use typed_amp::{precision::DType, precision::BF16, precision::F16};

/// FP16 linear → BF16 linear → FP32 linear, joined by casts.
type Arch = (
    (Linear<6, 16>, ReLU, ToBf16),
    (Linear<16, 16>, ReLU, ToF32),
    Linear<16, 3>,
);

type Working = (
    (
        typed_amp::dfdx::nn::modules::Linear<6, 16, f16, Cpu>,
        ReLU,
        ToBf16,
    ),
    (
        typed_amp::dfdx::nn::modules::Linear<16, 16, bf16, Cpu>,
        ReLU,
        ToF32,
    ),
    typed_amp::dfdx::nn::modules::Linear<16, 3, f32, Cpu>,
);

fn working(dev: &Cpu) -> Working {
    (
        (dev.build_module::<Linear<6, 16>, f16>(), ReLU, ToBf16),
        (dev.build_module::<Linear<16, 16>, bf16>(), ReLU, ToF32),
        dev.build_module::<Linear<16, 3>, f32>(),
    )
}

fn batch(dev: &Cpu) -> (Tensor<Rank2<8, 6>, f16, Cpu>, Tensor<Rank2<8, 3>, f32, Cpu>) {
    let x: Tensor<Rank2<8, 6>, f32, Cpu> = Cpu::seed_from_u64(17).sample_normal();
    let mut y = [[0.0f32; 3]; 8];
    for (i, row) in y.iter_mut().enumerate() {
        row[i % 3] = 1.0;
    }
    (x.to_dtype::<f16>(), dev.tensor(y))
}

#[test]
fn an_fp16_and_bf16_model_trains_behind_fp32_masters_with_a_scaler() {
    let dev = Cpu::seed_from_u64(4);
    let master = dev.build_module::<Arch, f32>();
    let initial = master.clone();
    let mut model = MasterWeights::<_, _, _, F16>::pair(master, working(&dev), &dev).unwrap();

    let summary: Vec<(String, DType)> = model
        .working()
        .param_summary()
        .into_iter()
        .map(|p| (p.path, p.dtype))
        .collect();
    let expected = [
        ("0.0.weight", DType::F16),
        ("0.0.bias", DType::F16),
        ("1.0.weight", DType::BF16),
        ("1.0.bias", DType::BF16),
        ("2.weight", DType::F32),
        ("2.bias", DType::F32),
    ]
    .map(|(p, d)| (p.to_string(), d));
    assert_eq!(summary, expected);
    assert!(model
        .master()
        .param_summary()
        .iter()
        .all(|p| p.dtype == DType::F32));

    let mut opt = Adam::new(
        model.master(),
        AdamConfig {
            lr: 1e-2,
            ..Default::default()
        },
    );
    let mut scaler = GradScaler::dynamic();
    let (x, y) = batch(&dev);
    let mut grads = model.alloc_grads().unwrap();
    let mut losses = Vec::new();
    let mut skipped = 0;
    for _ in 0..20 {
        let logits: Tensor<Rank2<8, 3>, f32, Cpu, _> =
            model.working().forward(x.clone().traced_mixed(grads));
        let loss = cross_entropy_with_logits_loss(logits, y.clone());
        losses.push(loss.value());
        let scaled = scaler.scale(loss).backward().unwrap();
        // The scaled gradients are in each parameter's own precision.
        let w = model.working();
        assert!(
            scaled.grads().get(&w.0 .0.weight).is_some(),
            "FP16 gradient"
        );
        assert!(
            scaled.grads().get(&w.1 .0.weight).is_some(),
            "BF16 gradient"
        );
        assert!(scaled.grads().get(&w.2.weight).is_some(), "FP32 gradient");
        let unscaled = scaler.unscale(&mut model, scaled).unwrap();
        let outcome = scaler.step(&mut opt, unscaled).unwrap();
        skipped += usize::from(outcome.skipped());
        grads = scaler.update(outcome).unwrap();
    }
    eprintln!(
        "FP16 + BF16 model: loss {:.4} -> {:.4}, {skipped} of 20 steps skipped, scale {}",
        losses[0],
        losses[19],
        scaler.get_scale()
    );
    assert!(skipped < 5, "{skipped} steps skipped");
    assert!(
        losses[19] < 0.5 * losses[0],
        "it learned: {} -> {}",
        losses[0],
        losses[19]
    );

    let (m, w) = (model.master(), model.working());
    // Every layer learned: the gradients reached the FP16 layer through both casts.
    assert_ne!(
        m.0 .0.weight.as_vec(),
        initial.0 .0.weight.as_vec(),
        "FP16 layer"
    );
    assert_ne!(
        m.1 .0.weight.as_vec(),
        initial.1 .0.weight.as_vec(),
        "BF16 layer"
    );
    assert_ne!(m.2.weight.as_vec(), initial.2.weight.as_vec(), "FP32 layer");
    // After the updates, each working parameter holds its master's value rounded to its own
    // precision.
    let f16_expected: Vec<f16> =
        m.0 .0
            .weight
            .as_vec()
            .into_iter()
            .map(f16::from_f32)
            .collect();
    assert_eq!(w.0 .0.weight.as_vec(), f16_expected);
    let bf16_expected: Vec<bf16> =
        m.1 .0
            .weight
            .as_vec()
            .into_iter()
            .map(bf16::from_f32)
            .collect();
    assert_eq!(w.1 .0.weight.as_vec(), bf16_expected);
    assert_eq!(w.2.weight.as_vec(), m.2.weight.as_vec());
}

#[test]
fn a_working_copy_declared_bf16_with_an_fp16_parameter_is_refused_by_name() {
    let dev = Cpu::seed_from_u64(5);
    let master = dev.build_module::<Arch, f32>();
    // As BF16 this copy could step without a scaler, which its FP16 layer cannot survive.
    let err = MasterWeights::<_, _, _, BF16>::pair(master.clone(), working(&dev), &dev)
        .err()
        .expect("an FP16 parameter in a BF16 working copy is refused");
    let message = err.to_string();
    eprintln!("{message}");
    assert!(
        matches!(&err, AmpError::ParamMismatch { path, .. } if path == "0.0.weight"),
        "{err:?}"
    );
    assert!(message.contains("`0.0.weight`"), "{message}");
    assert!(message.contains("BF16"), "{message}");
    assert!(
        message.replace("BF16", "").contains("F16"),
        "names FP16 too: {message}"
    );

    // Without the FP16 layer, BF16 and FP32 parameters make a valid BF16 working copy.
    type Bf16Arch = (
        (Linear<6, 16>, ReLU),
        (Linear<16, 16>, ReLU, ToF32),
        Linear<16, 3>,
    );
    let master = dev.build_module::<Bf16Arch, f32>();
    let working = (
        (dev.build_module::<Linear<6, 16>, bf16>(), ReLU),
        (dev.build_module::<Linear<16, 16>, bf16>(), ReLU, ToF32),
        dev.build_module::<Linear<16, 3>, f32>(),
    );
    MasterWeights::<_, _, _, BF16>::pair(master, working, &dev).unwrap();
}
