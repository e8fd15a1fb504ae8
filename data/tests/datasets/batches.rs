//! Batches in the model's entry precision: the same values as an FP32 batch cast at the
//! model's entry, bit for bit, and an entry cast that then records nothing.

use typed_amp::amp::CastTo;
use typed_amp::precision::AmpElem;
use typed_amp::prelude::*;
use typed_amp_data::{
    Batch, BatchError, FashionMnist, Flat, Image, Normalize, Split, CLASSES, IMAGE_SIZE,
};

/// The bits of values in any precision, to compare them exactly (NaN included).
fn bits<E: AmpElem>(values: &[E]) -> Vec<Vec<u8>> {
    values.iter().map(|v| v.to_le_bytes()).collect()
}

/// Every pixel value 0..=255 once, as one example (and the rest of it black).
fn every_byte() -> Split {
    let mut images = vec![0u8; 2 * IMAGE_SIZE];
    for (i, pixel) in images.iter_mut().take(256).enumerate() {
        *pixel = i as u8;
    }
    // Two examples: the second one all 255.
    images[IMAGE_SIZE..].fill(255);
    split(images, vec![3, 7])
}

fn split(images: Vec<u8>, labels: Vec<u8>) -> Split {
    let gz = |bytes: Vec<u8>| {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(&bytes).unwrap();
        e.finish().unwrap()
    };
    let count = labels.len() as u32;
    let mut idx_images = Vec::new();
    for field in [typed_amp_data::IMAGES_MAGIC, count, 28, 28] {
        idx_images.extend_from_slice(&field.to_be_bytes());
    }
    idx_images.extend_from_slice(&images);
    let mut idx_labels = typed_amp_data::LABELS_MAGIC.to_be_bytes().to_vec();
    idx_labels.extend_from_slice(&count.to_be_bytes());
    idx_labels.extend_from_slice(&labels);
    typed_amp_data::parse_split("images.gz", &gz(idx_images), "labels.gz", &gz(idx_labels))
        .expect("a well-formed split")
}

/// The FP32 pixels cast to `E` by typed-amp's cast (what a model's entry does to an FP32
/// batch), and the pixels built in `E` directly: equal bit for bit.
fn direct_equals_cast<P: typed_amp::precision::Precision>(
    split: &Split,
    indices: &[usize],
    norm: Normalize,
) where
    Cpu: typed_amp::device::Kernels<P::Elem>,
{
    let dev = Cpu::default();
    let fp32 = split.pixels::<f32>(indices, norm).unwrap();
    let n = fp32.len();
    let cast: Tensor<(usize,), P::Elem, Cpu> = dev.tensor_from_vec(fp32, (n,)).cast::<P>();
    let direct = split.pixels::<P::Elem>(indices, norm).unwrap();
    assert_eq!(
        bits(&direct),
        bits(&cast.as_vec()),
        "{:?} with {norm:?}",
        P::DTYPE
    );
}

#[test]
fn fp32_pixels_are_the_normalised_bytes() {
    let split = every_byte();
    for norm in [Normalize::UNIT, Normalize::FASHION_MNIST] {
        let pixels = split.pixels::<f32>(&[0], norm).unwrap();
        for p in 0..=255u8 {
            let expected = (f32::from(p) / 255.0 - norm.mean) / norm.std;
            assert_eq!(pixels[usize::from(p)].to_bits(), expected.to_bits());
        }
    }
    // UNIT is exactly p / 255.
    let pixels = split.pixels::<f32>(&[1, 0], Normalize::UNIT).unwrap();
    assert_eq!(pixels[0], 1.0);
    assert_eq!(pixels[IMAGE_SIZE + 128], 128.0 / 255.0);
}

#[test]
fn sixteen_bit_pixels_equal_the_fp32_batch_cast_bit_for_bit() {
    // Every byte value, under both normalisations.
    let split = every_byte();
    for norm in [Normalize::UNIT, Normalize::FASHION_MNIST] {
        direct_equals_cast::<F16>(&split, &[0, 1], norm);
        direct_equals_cast::<BF16>(&split, &[0, 1], norm);
        direct_equals_cast::<F32>(&split, &[0, 1], norm);
    }
    // And a real batch, in a shuffled order.
    let data = FashionMnist::embedded().unwrap();
    let indices = [1999, 5, 700, 0, 1234, 42];
    direct_equals_cast::<F16>(&data.train, &indices, Normalize::FASHION_MNIST);
    direct_equals_cast::<BF16>(&data.train, &indices, Normalize::FASHION_MNIST);
}

#[test]
fn a_batch_holds_its_examples_in_either_layout() {
    let data = FashionMnist::embedded().unwrap();
    let dev = Cpu::default();
    let indices = [10, 3, 999];
    let flat: Batch<Flat, f16, Cpu> = data
        .test
        .batch(&dev, &indices, Normalize::FASHION_MNIST)
        .unwrap();
    let image: Batch<Image, f16, Cpu> = data
        .test
        .batch(&dev, &indices, Normalize::FASHION_MNIST)
        .unwrap();
    assert_eq!(*flat.images.shape(), (3, Const::<IMAGE_SIZE>));
    assert_eq!(image.images.shape().0, 3);
    assert_eq!(flat.images.as_vec(), image.images.as_vec());
    assert_eq!(
        bits(&flat.images.as_vec()),
        bits(
            &data
                .test
                .pixels::<f16>(&indices, Normalize::FASHION_MNIST)
                .unwrap()
        )
    );
    let labels: Vec<u8> = indices.iter().map(|&i| data.test.label(i)).collect();
    assert_eq!(flat.labels, labels);
    let targets = flat.targets.as_vec();
    for (row, &label) in labels.iter().enumerate() {
        let one_hot: Vec<f32> = (0..CLASSES)
            .map(|c| if c == usize::from(label) { 1.0 } else { 0.0 })
            .collect();
        assert_eq!(targets[row * CLASSES..(row + 1) * CLASSES], one_hot[..]);
    }
    // An empty batch is a batch of nothing, not an error.
    let empty: Batch<Flat, bf16, Cpu> = data.test.batch(&dev, &[], Normalize::UNIT).unwrap();
    assert_eq!(empty.images.shape().0, 0);
}

#[test]
fn an_index_past_the_end_is_an_error_not_a_panic() {
    let data = FashionMnist::embedded().unwrap();
    let err = data
        .test
        .batch::<Flat, f32, Cpu>(&Cpu::default(), &[0, 1000, 5], Normalize::UNIT)
        .unwrap_err();
    assert!(
        matches!(
            err,
            BatchError::IndexOutOfRange {
                index: 1000,
                len: 1000
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "example 1000 is out of range: the split holds 1000 examples"
    );
}

#[typed_amp::amp(policy = "O2", cast_model_outputs = "fp32")]
struct Fp16Mlp {
    fc1: Linear<784, 32>,
    act: ReLU,
    fc2: Linear<32, 10>,
}

#[typed_amp::amp(policy = "O2", dtype = "bf16", cast_model_outputs = "fp32")]
struct Bf16Mlp {
    fc1: Linear<784, 32>,
    act: ReLU,
    fc2: Linear<32, 10>,
}

/// Runs `$model`'s O2 working model on one batch built in FP32 and on the same batch built in
/// its entry precision (`$marker`, elements `$elem`): the logits are equal bit for bit and the
/// tape of the second holds one op fewer (no entry cast). Also checks that the entry cast of a
/// batch already in the entry precision records nothing.
macro_rules! entry_precision_batches {
    ($model:ty, $marker:ty, $elem:ty) => {{
        use typed_amp::amp::AmpModel;
        // The model's entry precision is the one the batch is built in.
        let _: fn(<$model as AmpModel<Cpu>>::Input) -> $marker = |p| p;
        let data = FashionMnist::embedded().unwrap();
        let dev = Cpu::seed_from_u64(1);
        let model = <$model>::try_build(&dev).unwrap();
        let indices: Vec<usize> = (0..64).collect();
        let norm = Normalize::FASHION_MNIST;

        let fp32: Batch<Flat, f32, Cpu> = data.train.batch(&dev, &indices, norm).unwrap();
        let low: Batch<Flat, $elem, Cpu> = data.train.batch(&dev, &indices, norm).unwrap();

        // The entry cast of a batch in the entry precision records nothing; of an FP32 one, a
        // cast.
        let traced = low
            .images
            .clone()
            .traced_mixed(model.alloc_grads().unwrap());
        let entered = CastTo::<$marker>::try_cast_to(traced).unwrap();
        assert_eq!(entered.split_tape().1.num_ops(), 0);
        let traced = fp32
            .images
            .clone()
            .traced_mixed(model.alloc_grads().unwrap());
        let entered = CastTo::<$marker>::try_cast_to(traced).unwrap();
        assert_eq!(entered.split_tape().1.num_ops(), 1);

        let (logits32, tape32) = model
            .working()
            .forward(fp32.images.traced_mixed(model.alloc_grads().unwrap()))
            .split_tape();
        let (logits16, tape16) = model
            .working()
            .forward(low.images.traced_mixed(model.alloc_grads().unwrap()))
            .split_tape();
        assert_eq!(bits(&logits32.as_vec()), bits(&logits16.as_vec()));
        assert_eq!(tape32.num_ops(), tape16.num_ops() + 1);
    }};
}

#[test]
fn an_o2_model_fed_its_entry_precision_computes_the_same_logits_without_the_entry_cast() {
    entry_precision_batches!(Fp16Mlp, F16, f16);
    entry_precision_batches!(Bf16Mlp, BF16, bf16);
}
