//! Data sets for typed-amp's examples, notebooks and main job (`typed-amp`): Fashion-MNIST
//! ([`FashionMnist`]) and Shakespeare as characters ([`CharCorpus`], in [`text`]), each with
//! its loader and a subset compiled in. It is a crate of its own so that the library,
//! `typed-amp`, does not link 1.28 MB of images and 190 KB of plays into every program that
//! uses it.
//!
//! [`FashionMnist::load`] picks its source in this order:
//!
//! 1. a directory the caller names (it must hold the four files; there is no fallback,
//!    so a typo in a path is an error rather than a silent switch to other data);
//! 2. [`SYSTEM_DIR`], where Debian's `dataset-fashion-mnist` package installs the full
//!    set, when all four files are there;
//! 3. a subset compiled into this crate (the first 2000 training and the first 1000
//!    test examples), so examples and tests run without any download.
//!
//! The loaded [`FashionMnist::origin`] records which one was used.
//!
//! Files are the four standard gzip-compressed IDX files
//! ([`TRAIN_IMAGES_FILE`], [`TRAIN_LABELS_FILE`], [`TEST_IMAGES_FILE`],
//! [`TEST_LABELS_FILE`]). Every defect in them is reported as a [`DataError`] naming
//! the file; no file content can make the loader panic.
//!
//! ```
//! use typed_amp_data::{FashionMnist, CLASS_NAMES};
//!
//! let data = FashionMnist::embedded()?;
//! assert_eq!(data.train.len(), 2000);
//! let first = data.train.image(0); // 784 pixels, row-major, 0 = background
//! assert_eq!(first.len(), 28 * 28);
//! println!("{}: first label is {}", data.describe(), CLASS_NAMES[data.train.label(0) as usize]);
//! # Ok::<(), typed_amp_data::DataError>(())
//! ```
//!
//! [`Split::batch`] puts examples on a device as a [`Batch`], its images in the precision the
//! model computes in (FP32, FP16 or BF16: see [`batch`]).
//!
//! [`CharCorpus::load`] picks a text the same way (a named directory, else
//! [`SHAKESPEARE_SYSTEM_DIR`], else three plays and the sonnets compiled in), reads it as the
//! GPT spec says and gives its training and validation windows as token ids: see [`text`].
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod batch;
mod error;
mod fashion_mnist;
mod format;
mod idx;
mod origin;
mod split;
pub mod text;

pub use batch::{Batch, BatchError, Flat, Image, Layout, Normalize};
pub use error::DataError;
pub use fashion_mnist::FashionMnist;
pub use format::{
    CLASSES, CLASS_NAMES, IMAGES_MAGIC, IMAGE_SIDE, IMAGE_SIZE, LABELS_MAGIC, SYSTEM_DIR,
    TEST_IMAGES_FILE, TEST_LABELS_FILE, TRAIN_IMAGES_FILE, TRAIN_LABELS_FILE,
};
pub use idx::{parse_images, parse_labels, parse_split};
pub use origin::DataOrigin;
pub use split::{Split, TextSplit};
pub use text::{
    CharCorpus, TokenId, EMBEDDED_TEXT_FILES, FULL_SHAKESPEARE_CHARACTERS, FULL_SHAKESPEARE_FILES,
    FULL_SHAKESPEARE_VOCAB, SHAKESPEARE_SYSTEM_DIR, TEXT_FILE_SUFFIX,
};
