//! Batches as tensors in the precision a model takes at its entry.
//!
//! An O2 or O3 model casts its input to FP16 or BF16 first thing (its
//! [`AmpModel::Input`](typed_amp::amp::AmpModel::Input)). A batch built in FP32 and cast there
//! costs an extra pass over it and an FP32 copy of every batch; [`Split::batch`] writes the
//! pixels in the model's precision `E` directly, in one pass over the bytes. Each pixel value
//! (`p / 255`, then [`Normalize`]) is computed in FP32 and rounded once to `E`, so the batch
//! holds, bit for bit, what the FP32 batch cast to `E` holds, and the model's entry cast, now
//! from `E` to `E`, is free and records nothing on the tape.
//!
//! ```
//! use typed_amp::prelude::*;
//! use typed_amp_data::{Batch, FashionMnist, Flat, Normalize};
//!
//! let data = FashionMnist::embedded()?;
//! let dev = Cpu::default();
//! let batch: Batch<Flat, f16, Cpu> =
//!     data.train.batch(&dev, &[0, 1, 2], Normalize::FASHION_MNIST)?;
//! assert_eq!(batch.images.shape().0, 3); // (3, 784), FP16
//! assert_eq!(batch.labels, data.train.labels()[..3]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use typed_amp::device::Kernels;
use typed_amp::dfdx::prelude::{Const, Shape, Tensor};
use typed_amp::{device::AmpDevice, error::AmpError, precision::AmpElem};

use crate::{Split, CLASSES, IMAGE_SIDE, IMAGE_SIZE};

/// How a batch of `n` images is shaped as a tensor.
pub trait Layout {
    /// The tensor shape of a batch.
    type Shape: Shape;
    /// The shape of a batch of `examples` images.
    fn shape(examples: usize) -> Self::Shape;
}

/// Each image flattened, `(n, 784)`: the input of a multi-layer perceptron.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flat;

impl Layout for Flat {
    type Shape = (usize, Const<IMAGE_SIZE>);
    fn shape(examples: usize) -> Self::Shape {
        (examples, Const)
    }
}

/// Each image as one channel of 28×28, `(n, 1, 28, 28)`: the input of a convolution.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Image;

impl Layout for Image {
    type Shape = (usize, Const<1>, Const<IMAGE_SIDE>, Const<IMAGE_SIDE>);
    fn shape(examples: usize) -> Self::Shape {
        (examples, Const, Const, Const)
    }
}

/// What a pixel byte `p` becomes: `(p / 255 - mean) / std`, computed in FP32.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Normalize {
    /// Subtracted from `p / 255`.
    pub mean: f32,
    /// Divides `p / 255 - mean`.
    pub std: f32,
}

impl Normalize {
    /// `p / 255`, in `[0, 1]` (mean 0, standard deviation 1: exactly `p / 255`).
    pub const UNIT: Normalize = Normalize {
        mean: 0.0,
        std: 1.0,
    };

    /// Fashion-MNIST's pixel mean and standard deviation (of `p / 255`) over its training set:
    /// the values come out with mean 0 and standard deviation 1.
    pub const FASHION_MNIST: Normalize = Normalize {
        mean: 0.2860,
        std: 0.3530,
    };

    /// The value of pixel byte `pixel`, in FP32: `(pixel / 255 - mean) / std`.
    pub fn value(self, pixel: u8) -> f32 {
        (f32::from(pixel) / 255.0 - self.mean) / self.std
    }

    /// The value of every pixel byte in precision `E`: [`Normalize::value`] rounded once to
    /// `E` (to nearest, ties to even), as a cast of the FP32 value rounds it.
    pub fn table<E: AmpElem>(self) -> [E; 256] {
        std::array::from_fn(|pixel| AmpElem::from_f32(self.value(pixel as u8)))
    }
}

/// Why a batch could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    /// An example index past the end of the split.
    #[error("example {index} is out of range: the split holds {len} examples")]
    IndexOutOfRange {
        /// The index asked for.
        index: usize,
        /// Examples in the split.
        len: usize,
    },
    /// The device could not hold the batch.
    #[error(transparent)]
    Device(#[from] AmpError),
}

/// A batch of examples on a device: images in precision `E`, laid out as `L` says, and their
/// labels, one-hot in FP32 (losses are computed in FP32) and as class indices.
#[derive(Debug)]
pub struct Batch<L: Layout, E: AmpElem, D: AmpDevice + Kernels<E>> {
    /// The images: [`Normalize`]d pixels rounded once to `E`.
    pub images: Tensor<L::Shape, E, D>,
    /// One row per example: 1 at its label, 0 elsewhere.
    pub targets: Tensor<(usize, Const<CLASSES>), f32, D>,
    /// The examples' labels (class indices below [`CLASSES`]).
    pub labels: Vec<u8>,
}

impl Split {
    /// The pixels of the examples `indices`, image after image, each [`Normalize`]d in FP32 and
    /// rounded once to `E`: what [`Split::batch`] puts on the device.
    pub fn pixels<E: AmpElem>(
        &self,
        indices: &[usize],
        normalize: Normalize,
    ) -> Result<Vec<E>, BatchError> {
        self.check(indices)?;
        let table = normalize.table::<E>();
        let mut pixels = Vec::with_capacity(indices.len() * IMAGE_SIZE);
        for &i in indices {
            pixels.extend(self.image(i).iter().map(|&p| table[usize::from(p)]));
        }
        Ok(pixels)
    }

    /// The examples `indices` as a [`Batch`] on `dev`, images in precision `E` (the model's
    /// entry precision, `<M::Input as typed_amp::precision::Precision>::Elem` for an `#[amp]`
    /// model `M`).
    pub fn batch<L: Layout, E: AmpElem, D: AmpDevice + Kernels<E>>(
        &self,
        dev: &D,
        indices: &[usize],
        normalize: Normalize,
    ) -> Result<Batch<L, E, D>, BatchError> {
        let pixels = self.pixels::<E>(indices, normalize)?;
        let mut one_hot = vec![0.0f32; indices.len() * CLASSES];
        let labels: Vec<u8> = indices.iter().map(|&i| self.label(i)).collect();
        for (row, &label) in labels.iter().enumerate() {
            one_hot[row * CLASSES + usize::from(label)] = 1.0;
        }
        let images = dev
            .try_tensor_from_vec(pixels, L::shape(indices.len()))
            .map_err(AmpError::device)?;
        let targets = dev
            .try_tensor_from_vec(one_hot, (indices.len(), Const))
            .map_err(AmpError::device)?;
        Ok(Batch {
            images,
            targets,
            labels,
        })
    }

    /// Whether every index names an example of this split.
    fn check(&self, indices: &[usize]) -> Result<(), BatchError> {
        match indices.iter().find(|&&i| i >= self.len()) {
            Some(&index) => Err(BatchError::IndexOutOfRange {
                index,
                len: self.len(),
            }),
            None => Ok(()),
        }
    }
}
