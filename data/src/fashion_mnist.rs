//! The Fashion-MNIST loader: [`FashionMnist`], from a directory, the system's copy or the subset
//! compiled in (the crate documentation says in which order).

use std::io;
use std::path::{Path, PathBuf};

use crate::{
    parse_split, DataError, DataOrigin, Split, SYSTEM_DIR, TEST_IMAGES_FILE, TEST_LABELS_FILE,
    TRAIN_IMAGES_FILE, TRAIN_LABELS_FILE,
};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::*;
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
