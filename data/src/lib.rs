//! Fashion-MNIST for typed-amp's examples, notebooks and main job (`typed-amp`): the loader
//! and a subset compiled in. It is a crate of its own so that the library, `typed-amp`, does not
//! link 1.28 MB of images into every program that uses it.
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
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod batch;

pub use batch::{Batch, BatchError, Flat, Image, Layout, Normalize};

use std::io::{self, Read};
use std::path::{Path, PathBuf};

use flate2::read::MultiGzDecoder;

/// Height and width of every image, in pixels.
pub const IMAGE_SIDE: usize = 28;
/// Pixels per image (`28 * 28`); one byte each, 0 = background, 255 = full ink.
pub const IMAGE_SIZE: usize = IMAGE_SIDE * IMAGE_SIDE;
/// Number of classes; labels are `0..CLASSES`.
pub const CLASSES: usize = 10;
/// Human-readable class names, indexed by label.
pub const CLASS_NAMES: [&str; CLASSES] = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
];

/// Where Debian's `dataset-fashion-mnist` package installs the full data set.
pub const SYSTEM_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// File name of the training images.
pub const TRAIN_IMAGES_FILE: &str = "train-images-idx3-ubyte.gz";
/// File name of the training labels.
pub const TRAIN_LABELS_FILE: &str = "train-labels-idx1-ubyte.gz";
/// File name of the test images.
pub const TEST_IMAGES_FILE: &str = "t10k-images-idx3-ubyte.gz";
/// File name of the test labels.
pub const TEST_LABELS_FILE: &str = "t10k-labels-idx1-ubyte.gz";

/// Magic number opening an IDX file of unsigned-byte, three-dimensional data (images).
pub const IMAGES_MAGIC: u32 = 0x0000_0803;
/// Magic number opening an IDX file of unsigned-byte, one-dimensional data (labels).
pub const LABELS_MAGIC: u32 = 0x0000_0801;

/// Pseudo-directory naming the compiled-in files in error messages.
const EMBEDDED_DIR: &str = "<embedded fashion-mnist-subset>";

const EMBEDDED_TRAIN_IMAGES: &[u8] =
    include_bytes!("../fashion-mnist-subset/train-images-idx3-ubyte.gz");
const EMBEDDED_TRAIN_LABELS: &[u8] =
    include_bytes!("../fashion-mnist-subset/train-labels-idx1-ubyte.gz");
const EMBEDDED_TEST_IMAGES: &[u8] =
    include_bytes!("../fashion-mnist-subset/t10k-images-idx3-ubyte.gz");
const EMBEDDED_TEST_LABELS: &[u8] =
    include_bytes!("../fashion-mnist-subset/t10k-labels-idx1-ubyte.gz");

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
        /// The magic number an images ([`IMAGES_MAGIC`]) or labels ([`LABELS_MAGIC`]) file has.
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

/// One split (training or test) of the data set: images and their labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    /// `len() * IMAGE_SIZE` pixels, image after image, each row-major.
    images: Vec<u8>,
    /// One class index (`< CLASSES`) per image.
    labels: Vec<u8>,
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

    /// The `i`-th label, a class index below [`CLASSES`] (see [`CLASS_NAMES`]).
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

/// Which data a [`FashionMnist`] was loaded from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataOrigin {
    /// The four files in this directory.
    Directory(PathBuf),
    /// The subset compiled into this crate.
    Embedded,
}

/// The Fashion-MNIST data set (Xiao, Rasul & Vollgraf 2017; MIT licence, Zalando SE).
#[derive(Clone, Debug)]
pub struct FashionMnist {
    /// Training examples.
    pub train: Split,
    /// Test examples.
    pub test: Split,
    /// Where they came from.
    pub origin: DataOrigin,
}

impl FashionMnist {
    /// Loads from `data_dir` if given (no fallback), else from [`SYSTEM_DIR`] if all four
    /// files exist there, else the embedded subset.
    ///
    /// A complete but damaged [`SYSTEM_DIR`] is an error, not a reason to fall back:
    /// silently training on the small subset would be worse.
    pub fn load(data_dir: Option<&Path>) -> Result<Self, DataError> {
        match data_dir {
            Some(dir) => Self::load_dir(dir),
            None if has_all_files(Path::new(SYSTEM_DIR)) => Self::load_dir(Path::new(SYSTEM_DIR)),
            None => Self::embedded(),
        }
    }

    /// Loads the four standard files from `dir`. Both splits must hold at least one example:
    /// an empty one is a [`DataError::Empty`] naming its files (training on it would take no
    /// step, testing on it would report an accuracy of nothing).
    pub fn load_dir(dir: &Path) -> Result<Self, DataError> {
        let read = |name: &str| -> Result<(PathBuf, Vec<u8>), DataError> {
            let path = dir.join(name);
            match std::fs::read(&path) {
                Ok(bytes) => Ok((path, bytes)),
                Err(err) if err.kind() == io::ErrorKind::NotFound => {
                    Err(DataError::Missing { path })
                }
                Err(source) => Err(DataError::Io { path, source }),
            }
        };
        // Look for all four files before decompressing any, so a missing file is reported
        // at once rather than after seconds of work.
        let train_images = read(TRAIN_IMAGES_FILE)?;
        let train_labels = read(TRAIN_LABELS_FILE)?;
        let test_images = read(TEST_IMAGES_FILE)?;
        let test_labels = read(TEST_LABELS_FILE)?;
        type File = (PathBuf, Vec<u8>);
        let split = |(images_path, images): File, (labels_path, labels): File, name| {
            let split = parse_split(&images_path, &images, &labels_path, &labels)?;
            if split.is_empty() {
                return Err(DataError::Empty {
                    images_path,
                    labels_path,
                    split: name,
                });
            }
            Ok(split)
        };
        Ok(Self {
            train: split(train_images, train_labels, "training")?,
            test: split(test_images, test_labels, "test")?,
            origin: DataOrigin::Directory(dir.to_path_buf()),
        })
    }

    /// The subset compiled into this crate: the first 2000 training and the first 1000
    /// test examples, in the original order (see `data/fashion-mnist-subset/README.md`).
    pub fn embedded() -> Result<Self, DataError> {
        let embedded = |name: &str| Path::new(EMBEDDED_DIR).join(name);
        Ok(Self {
            train: parse_split(
                embedded(TRAIN_IMAGES_FILE),
                EMBEDDED_TRAIN_IMAGES,
                embedded(TRAIN_LABELS_FILE),
                EMBEDDED_TRAIN_LABELS,
            )?,
            test: parse_split(
                embedded(TEST_IMAGES_FILE),
                EMBEDDED_TEST_IMAGES,
                embedded(TEST_LABELS_FILE),
                EMBEDDED_TEST_LABELS,
            )?,
            origin: DataOrigin::Embedded,
        })
    }

    /// One line saying which data this is, e.g.
    /// `Fashion-MNIST, full (60000 train / 10000 test) from /usr/share/datasets/fashion-mnist`
    /// or `Fashion-MNIST embedded subset (2000 train / 1000 test)`.
    pub fn describe(&self) -> String {
        let (train, test) = (self.train.len(), self.test.len());
        match &self.origin {
            DataOrigin::Embedded => {
                format!("Fashion-MNIST embedded subset ({train} train / {test} test)")
            }
            DataOrigin::Directory(dir) => {
                let full = if (train, test) == (60_000, 10_000) {
                    ", full"
                } else {
                    ""
                };
                format!(
                    "Fashion-MNIST{full} ({train} train / {test} test) from {}",
                    dir.display()
                )
            }
        }
    }
}

/// Whether `dir` holds all four standard files.
fn has_all_files(dir: &Path) -> bool {
    [
        TRAIN_IMAGES_FILE,
        TRAIN_LABELS_FILE,
        TEST_IMAGES_FILE,
        TEST_LABELS_FILE,
    ]
    .iter()
    .all(|name| dir.join(name).is_file())
}

/// Parses a gzip-compressed IDX images file (the bytes of e.g. [`TRAIN_IMAGES_FILE`]) into
/// `count * IMAGE_SIZE` pixels. `path` only names the file in errors.
pub fn parse_images(path: impl AsRef<Path>, gzip_bytes: &[u8]) -> Result<Vec<u8>, DataError> {
    let path = path.as_ref();
    // The dimensions are checked before the payload is read: a file of other-sized images
    // is reported as such, and a hostile header cannot overflow the length computation.
    decompress_idx(path, gzip_bytes, IMAGES_MAGIC, |[count, rows, cols]| {
        if (rows, cols) == (IMAGE_SIDE as u32, IMAGE_SIDE as u32) {
            Ok(u64::from(count) * IMAGE_SIZE as u64)
        } else {
            Err(DataError::UnexpectedDimensions {
                path: path.to_path_buf(),
                rows,
                cols,
            })
        }
    })
}

/// Parses a gzip-compressed IDX labels file (the bytes of e.g. [`TRAIN_LABELS_FILE`]) into
/// one class index per example, each checked to be below [`CLASSES`]. `path` only names
/// the file in errors.
pub fn parse_labels(path: impl AsRef<Path>, gzip_bytes: &[u8]) -> Result<Vec<u8>, DataError> {
    let path = path.as_ref();
    let labels = decompress_idx(path, gzip_bytes, LABELS_MAGIC, |[count]| {
        Ok(u64::from(count))
    })?;
    if let Some((index, &label)) = labels
        .iter()
        .enumerate()
        .find(|(_, &label)| usize::from(label) >= CLASSES)
    {
        return Err(DataError::LabelOutOfRange {
            path: path.to_path_buf(),
            index,
            label,
        });
    }
    Ok(labels)
}

/// Parses an images file and its labels file (both gzip-compressed IDX bytes) into a
/// [`Split`], checking that they hold the same number of examples.
pub fn parse_split(
    images_path: impl AsRef<Path>,
    images_gzip: &[u8],
    labels_path: impl AsRef<Path>,
    labels_gzip: &[u8],
) -> Result<Split, DataError> {
    let images = parse_images(&images_path, images_gzip)?;
    let labels = parse_labels(&labels_path, labels_gzip)?;
    let image_count = images.len() / IMAGE_SIZE;
    if image_count != labels.len() {
        return Err(DataError::CountMismatch {
            images_path: images_path.as_ref().to_path_buf(),
            image_count,
            labels_path: labels_path.as_ref().to_path_buf(),
            label_count: labels.len(),
        });
    }
    Ok(Split { images, labels })
}

/// Decompresses an IDX file, checks its magic number and length, and returns the payload.
///
/// The header is the magic number and `DIMS` dimension fields (count first);
/// `payload_len` validates the dimensions and says how many payload bytes they describe.
fn decompress_idx<const DIMS: usize>(
    path: &Path,
    gzip_bytes: &[u8],
    magic: u32,
    payload_len: impl Fn([u32; DIMS]) -> Result<u64, DataError>,
) -> Result<Vec<u8>, DataError> {
    let header_len = 4 * (1 + DIMS as u64);
    let corrupt_gzip = |source| DataError::CorruptGzip {
        path: path.to_path_buf(),
        source,
    };
    let truncated = |expected, found| DataError::Truncated {
        path: path.to_path_buf(),
        expected,
        found,
    };
    // gzip files may hold several members (as `cat a.gz b.gz` makes); all are one stream.
    let mut decoder = MultiGzDecoder::new(gzip_bytes);

    let mut header = Vec::with_capacity(header_len as usize);
    (&mut decoder)
        .take(header_len)
        .read_to_end(&mut header)
        .map_err(corrupt_gzip)?;
    let found_header_len = header.len() as u64;
    // Check the magic number before the full header length, so that a wrong kind of
    // file is reported as such even when it is tiny.
    if let Some(found_magic) = header.get(0..4).map(read_u32_be) {
        if found_magic != magic {
            return Err(DataError::BadMagic {
                path: path.to_path_buf(),
                found: found_magic,
                expected: magic,
            });
        }
    }
    if found_header_len < header_len {
        return Err(truncated(header_len, found_header_len));
    }
    let mut dimensions = [0; DIMS];
    for (dimension, bytes) in dimensions.iter_mut().zip(header[4..].chunks_exact(4)) {
        *dimension = read_u32_be(bytes);
    }
    let expected = payload_len(dimensions)?;

    // Read one byte past the expected end, so that trailing data is detected without
    // decompressing an arbitrarily long tail. The capacity is capped because `expected`
    // comes from an unchecked header.
    let mut payload = Vec::with_capacity(expected.min(64 << 20) as usize);
    (&mut decoder)
        .take(expected.saturating_add(1))
        .read_to_end(&mut payload)
        .map_err(corrupt_gzip)?;
    let found = payload.len() as u64;
    if found < expected {
        return Err(truncated(header_len + expected, header_len + found));
    }
    if found > expected {
        return Err(DataError::TrailingData {
            path: path.to_path_buf(),
            expected: header_len + expected,
        });
    }
    Ok(payload)
}

/// Reads a big-endian `u32` from a slice of exactly four bytes.
fn read_u32_be(bytes: &[u8]) -> u32 {
    bytes
        .iter()
        .fold(0, |value, &byte| (value << 8) | u32::from(byte))
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::{write::GzEncoder, Compression};
    use std::io::Write;

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
        encoder
            .write_all(bytes)
            .expect("writing to a Vec cannot fail");
        encoder.finish().expect("writing to a Vec cannot fail")
    }

    fn idx_images(count: u32, rows: u32, cols: u32, payload: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::new();
        for field in [IMAGES_MAGIC, count, rows, cols] {
            bytes.extend_from_slice(&field.to_be_bytes());
        }
        bytes.extend_from_slice(payload);
        bytes
    }

    fn idx_labels(labels: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&LABELS_MAGIC.to_be_bytes());
        bytes.extend_from_slice(&(labels.len() as u32).to_be_bytes());
        bytes.extend_from_slice(labels);
        bytes
    }

    #[test]
    fn parses_well_formed_split() {
        let pixels: Vec<u8> = (0..2 * IMAGE_SIZE).map(|i| (i % 251) as u8).collect();
        let split = parse_split(
            "img.gz",
            &gzip(&idx_images(2, 28, 28, &pixels)),
            "lbl.gz",
            &gzip(&idx_labels(&[3, 9])),
        )
        .expect("well-formed input");
        assert_eq!(split.len(), 2);
        assert_eq!(split.image(1), &pixels[IMAGE_SIZE..]);
        assert_eq!(split.labels(), &[3, 9]);
        assert_eq!(split.class_counts()[9], 1);
    }

    #[test]
    fn empty_split_is_valid() {
        let split = parse_split(
            "img.gz",
            &gzip(&idx_images(0, 28, 28, &[])),
            "lbl.gz",
            &gzip(&idx_labels(&[])),
        )
        .expect("empty but well-formed");
        assert!(split.is_empty());
    }

    #[test]
    fn short_header_is_truncated() {
        let err = parse_images("img.gz", &gzip(&IMAGES_MAGIC.to_be_bytes())).unwrap_err();
        assert!(matches!(
            err,
            DataError::Truncated {
                expected: 16,
                found: 4,
                ..
            }
        ));
    }

    #[test]
    fn tiny_file_of_wrong_kind_is_bad_magic() {
        let err = parse_labels("lbl.gz", &gzip(&IMAGES_MAGIC.to_be_bytes())).unwrap_err();
        assert!(matches!(
            err,
            DataError::BadMagic {
                found: IMAGES_MAGIC,
                ..
            }
        ));
        assert!(err.to_string().contains("0x00000803"), "{err}");
    }

    #[test]
    fn empty_gzip_payload_is_truncated() {
        let err = parse_labels("lbl.gz", &gzip(&[])).unwrap_err();
        assert!(matches!(err, DataError::Truncated { found: 0, .. }));
    }

    #[test]
    fn trailing_payload_is_rejected() {
        let mut bytes = idx_labels(&[1, 2]);
        bytes.push(0);
        let err = parse_labels("lbl.gz", &gzip(&bytes)).unwrap_err();
        assert!(matches!(err, DataError::TrailingData { expected: 10, .. }));
    }

    #[test]
    fn huge_header_count_does_not_allocate_or_panic() {
        let err =
            parse_images("img.gz", &gzip(&idx_images(u32::MAX, 28, 28, &[0; 10]))).unwrap_err();
        assert!(matches!(err, DataError::Truncated { found: 26, .. }));
    }

    #[test]
    fn huge_dimensions_are_rejected_before_reading_the_payload() {
        let header = idx_images(u32::MAX, u32::MAX, u32::MAX, &[]);
        let err = parse_images("img.gz", &gzip(&header)).unwrap_err();
        assert!(matches!(
            err,
            DataError::UnexpectedDimensions {
                rows: u32::MAX,
                cols: u32::MAX,
                ..
            }
        ));
    }

    #[test]
    fn truncated_gzip_stream_is_corrupt_gzip() {
        let pixels = vec![7u8; IMAGE_SIZE];
        let compressed = gzip(&idx_images(1, 28, 28, &pixels));
        let err = parse_images("img.gz", &compressed[..compressed.len() / 2]).unwrap_err();
        assert!(matches!(err, DataError::CorruptGzip { .. }), "{err:?}");
    }

    #[test]
    fn embedded_subset_matches_its_readme() {
        let data = FashionMnist::embedded().expect("embedded subset is valid");
        assert_eq!(
            data.train.class_counts(),
            [194, 216, 202, 195, 186, 200, 194, 215, 198, 200]
        );
        assert_eq!(
            data.test.class_counts(),
            [107, 105, 111, 93, 115, 87, 97, 95, 95, 95]
        );
    }
}
