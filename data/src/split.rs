//! The data sets' splits: Fashion-MNIST's [`Split`] (images and labels) and a corpus's
//! [`TextSplit`].

use std::fmt;

use crate::{CLASSES, IMAGE_SIZE};

/// One split (training or test) of the data set: images and their labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    /// `len() * IMAGE_SIZE` pixels, image after image, each row-major.
    pub(crate) images: Vec<u8>,
    /// One class index (`< CLASSES`) per image.
    pub(crate) labels: Vec<u8>,
}

impl Split {
    /// Number of examples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether the split holds no examples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The `i`-th image: [`IMAGE_SIZE`] pixels, row-major, 0 = background.
    ///
    /// # Panics
    /// If `i >= self.len()`.
    pub fn image(&self, i: usize) -> &[u8] {
        &self.images[i * IMAGE_SIZE..(i + 1) * IMAGE_SIZE]
    }

    /// The `i`-th label, a class index below [`CLASSES`] (see [`CLASS_NAMES`](crate::CLASS_NAMES)).
    ///
    /// # Panics
    /// If `i >= self.len()`.
    pub fn label(&self, i: usize) -> u8 {
        self.labels[i]
    }

    /// All pixels: `len() * IMAGE_SIZE` bytes, image after image.
    pub fn images(&self) -> &[u8] {
        &self.images
    }

    /// All labels, one per image.
    pub fn labels(&self) -> &[u8] {
        &self.labels
    }

    /// Number of examples of each class.
    pub fn class_counts(&self) -> [usize; CLASSES] {
        let mut counts = [0; CLASSES];
        for &label in &self.labels {
            counts[label as usize] += 1;
        }
        counts
    }
}

/// One of a [`CharCorpus`](crate::CharCorpus)'s two splits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TextSplit {
    /// The first `n * 9 / 10` characters.
    Train,
    /// The remaining characters.
    Validation,
}

impl fmt::Display for TextSplit {
    /// `training` or `validation`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TextSplit::Train => "training",
            TextSplit::Validation => "validation",
        })
    }
}
