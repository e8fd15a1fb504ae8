//! Why a Fashion-MNIST file could not be loaded ([`DataError`]).

use std::io;
use std::path::PathBuf;

use crate::{CLASSES, IMAGES_MAGIC, IMAGE_SIDE};

/// Why a Fashion-MNIST file could not be loaded. Every variant names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// A required file does not exist.
    #[error("{}: file not found", .path.display())]
    Missing {
        /// The file that was looked for.
        path: PathBuf,
    },

    /// The file exists but could not be read.
    #[error("{}: cannot read file: {source}", .path.display())]
    Io {
        /// The file being read.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },

    /// The file is not a valid gzip stream (not gzip at all, or damaged).
    #[error("{}: not a valid gzip file: {source}", .path.display())]
    CorruptGzip {
        /// The file being decompressed.
        path: PathBuf,
        /// The decompressor's error.
        source: io::Error,
    },

    /// The IDX header does not start with the expected magic number.
    #[error(
        "{}: bad magic number {found:#010x}, expected {expected:#010x} (not an IDX {kind} file)",
        .path.display(),
        kind = if *.expected == IMAGES_MAGIC { "images" } else { "labels" }
    )]
    BadMagic {
        /// The file whose header is wrong.
        path: PathBuf,
        /// The magic number in the file.
        found: u32,
        /// The magic number an images ([`IMAGES_MAGIC`]) or labels ([`LABELS_MAGIC`](crate::LABELS_MAGIC)) file has.
        expected: u32,
    },

    /// The decompressed file is shorter than its header says.
    #[error(
        "{}: truncated: expected {expected} bytes after decompression, found {found}",
        .path.display()
    )]
    Truncated {
        /// The file that is too short.
        path: PathBuf,
        /// Bytes the header (or the header itself) requires.
        expected: u64,
        /// Bytes the file holds.
        found: u64,
    },

    /// The decompressed file continues past the data its header describes.
    #[error(
        "{}: trailing data after the {expected} bytes the header describes",
        .path.display()
    )]
    TrailingData {
        /// The file that is too long.
        path: PathBuf,
        /// Bytes the header describes.
        expected: u64,
    },

    /// An images file and its labels file hold different numbers of examples.
    #[error(
        "{} holds {image_count} images but {} holds {label_count} labels",
        .images_path.display(),
        .labels_path.display()
    )]
    CountMismatch {
        /// The images file.
        images_path: PathBuf,
        /// Images it holds.
        image_count: usize,
        /// The labels file.
        labels_path: PathBuf,
        /// Labels it holds.
        label_count: usize,
    },

    /// The images are not 28x28.
    #[error(
        "{}: images are {rows}x{cols}, expected {IMAGE_SIDE}x{IMAGE_SIDE}",
        .path.display()
    )]
    UnexpectedDimensions {
        /// The images file.
        path: PathBuf,
        /// Rows per image in the header.
        rows: u32,
        /// Columns per image in the header.
        cols: u32,
    },

    /// A split's files hold no examples (valid, but nothing to train on or to test with).
    #[error(
        "{} and {} hold no examples: the {split} split needs at least one",
        .images_path.display(),
        .labels_path.display()
    )]
    Empty {
        /// The images file.
        images_path: PathBuf,
        /// The labels file.
        labels_path: PathBuf,
        /// Which split: `training` or `test`.
        split: &'static str,
    },

    /// A label is not a class index (`0..10`).
    #[error(
        "{}: label {label} at index {index} is out of range (expected 0..{CLASSES})",
        .path.display()
    )]
    LabelOutOfRange {
        /// The labels file.
        path: PathBuf,
        /// Position of the first bad label.
        index: usize,
        /// The bad label.
        label: u8,
    },
}
