//! Fashion-MNIST loader: the embedded subset, the full set when installed, and one test
//! per kind of damaged file.

use std::io::Write;
use std::path::Path;

use flate2::{write::GzEncoder, Compression};
use typed_amp_data::{
    DataError, DataOrigin, FashionMnist, CLASSES, IMAGES_MAGIC, IMAGE_SIZE, LABELS_MAGIC,
    SYSTEM_DIR, TEST_IMAGES_FILE, TEST_LABELS_FILE, TRAIN_IMAGES_FILE, TRAIN_LABELS_FILE,
};

use crate::common::TempDir;

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
    encoder.write_all(bytes).expect("write to Vec");
    encoder.finish().expect("write to Vec")
}

/// Uncompressed IDX images file: header fields as given, then `payload`.
fn idx_images(magic: u32, count: u32, rows: u32, cols: u32, payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for field in [magic, count, rows, cols] {
        bytes.extend_from_slice(&field.to_be_bytes());
    }
    bytes.extend_from_slice(payload);
    bytes
}

/// Uncompressed IDX labels file with a correct header.
fn idx_labels(labels: &[u8]) -> Vec<u8> {
    let mut bytes = LABELS_MAGIC.to_be_bytes().to_vec();
    bytes.extend_from_slice(&(labels.len() as u32).to_be_bytes());
    bytes.extend_from_slice(labels);
    bytes
}

fn valid_images(count: usize) -> Vec<u8> {
    let pixels: Vec<u8> = (0..count * IMAGE_SIZE).map(|i| (i % 256) as u8).collect();
    idx_images(IMAGES_MAGIC, count as u32, 28, 28, &pixels)
}

fn valid_labels(count: usize) -> Vec<u8> {
    let labels: Vec<u8> = (0..count).map(|i| (i % CLASSES) as u8).collect();
    idx_labels(&labels)
}

/// A directory with four small, valid files (5 train, 3 test examples).
fn valid_dir(test_name: &str) -> TempDir {
    let dir = TempDir::new(&format!("fashion-mnist-{test_name}"));
    dir.write(TRAIN_IMAGES_FILE, &gzip(&valid_images(5)));
    dir.write(TRAIN_LABELS_FILE, &gzip(&valid_labels(5)));
    dir.write(TEST_IMAGES_FILE, &gzip(&valid_images(3)));
    dir.write(TEST_LABELS_FILE, &gzip(&valid_labels(3)));
    dir
}

/// Loads `dir` explicitly and returns the error, which must name `file_name`.
fn load_error(dir: &TempDir, file_name: &str) -> DataError {
    let err = FashionMnist::load(Some(dir)).expect_err("damaged data must not load");
    let message = err.to_string();
    assert!(
        message.contains(file_name),
        "error should name {file_name}: {message}"
    );
    err
}

#[test]
fn embedded_subset_loads() {
    let data = FashionMnist::embedded().expect("embedded subset");
    assert_eq!(data.train.len(), 2000);
    assert_eq!(data.test.len(), 1000);
    assert_eq!(data.train.images().len(), 2000 * IMAGE_SIZE);
    assert_eq!(data.test.images().len(), 1000 * IMAGE_SIZE);
    assert!(data.train.labels().iter().all(|&l| (l as usize) < CLASSES));
    assert!(data.test.labels().iter().all(|&l| (l as usize) < CLASSES));
    // Every class is present in both splits, so accuracy on the subset means something.
    assert!(data.train.class_counts().iter().all(|&n| n > 150));
    assert!(data.test.class_counts().iter().all(|&n| n > 80));
    assert_eq!(data.origin, DataOrigin::Embedded);
    assert_eq!(
        data.describe(),
        "Fashion-MNIST embedded subset (2000 train / 1000 test)"
    );
}

#[test]
fn full_set_loads_when_installed() {
    let system_dir = Path::new(SYSTEM_DIR);
    let installed = [
        TRAIN_IMAGES_FILE,
        TRAIN_LABELS_FILE,
        TEST_IMAGES_FILE,
        TEST_LABELS_FILE,
    ]
    .iter()
    .all(|name| system_dir.join(name).is_file());
    if !installed {
        eprintln!("skipping: Fashion-MNIST not installed at {SYSTEM_DIR} (dataset-fashion-mnist)");
        return;
    }
    let data = FashionMnist::load(None).expect("full set");
    assert_eq!(data.train.len(), 60_000);
    assert_eq!(data.test.len(), 10_000);
    assert_eq!(data.origin, DataOrigin::Directory(system_dir.to_path_buf()));
    assert_eq!(
        data.describe(),
        format!("Fashion-MNIST, full (60000 train / 10000 test) from {SYSTEM_DIR}")
    );
    assert_eq!(data.train.class_counts(), [6000; CLASSES]);
    assert_eq!(data.test.class_counts(), [1000; CLASSES]);

    // The embedded subset is documented as the first examples of each split.
    let subset = FashionMnist::embedded().expect("embedded subset");
    assert_eq!(
        subset.train.images(),
        &data.train.images()[..2000 * IMAGE_SIZE]
    );
    assert_eq!(subset.train.labels(), &data.train.labels()[..2000]);
    assert_eq!(
        subset.test.images(),
        &data.test.images()[..1000 * IMAGE_SIZE]
    );
    assert_eq!(subset.test.labels(), &data.test.labels()[..1000]);
}

#[test]
fn explicit_directory_loads_and_says_so() {
    let dir = valid_dir("explicit");
    let data = FashionMnist::load(Some(&dir)).expect("valid files");
    assert_eq!((data.train.len(), data.test.len()), (5, 3));
    assert_eq!(data.train.label(4), 4);
    assert_eq!(data.test.image(2)[0], ((2 * IMAGE_SIZE) % 256) as u8);
    assert_eq!(data.origin, DataOrigin::Directory(dir.to_path_buf()));
    assert_eq!(
        data.describe(),
        format!("Fashion-MNIST (5 train / 3 test) from {}", dir.display())
    );
}

#[test]
fn multi_member_gzip_loads_as_one_stream() {
    let dir = valid_dir("multi-member");
    let images = valid_images(5);
    let (head, tail) = images.split_at(100);
    dir.write(TRAIN_IMAGES_FILE, &[gzip(head), gzip(tail)].concat());
    let data = FashionMnist::load(Some(&dir)).expect("a two-member gzip file");
    assert_eq!(data.train.len(), 5);
    assert_eq!(
        data.train.image(4)[IMAGE_SIZE - 1],
        ((5 * IMAGE_SIZE - 1) % 256) as u8
    );
}

#[test]
fn missing_file_in_explicit_directory() {
    let dir = valid_dir("missing");
    std::fs::remove_file(dir.join(TEST_LABELS_FILE)).expect("remove");
    let err = load_error(&dir, TEST_LABELS_FILE);
    assert!(
        matches!(&err, DataError::Missing { path } if *path == dir.join(TEST_LABELS_FILE)),
        "{err:?}"
    );
    assert!(err.to_string().contains("not found"), "{err}");
}

#[test]
fn missing_explicit_directory_does_not_fall_back() {
    let dir = TempDir::new("fashion-mnist-no-such-dir");
    let absent = dir.join("absent");
    let err = FashionMnist::load(Some(&absent)).expect_err("no fallback");
    assert!(matches!(err, DataError::Missing { .. }), "{err:?}");
    assert!(err.to_string().contains(TRAIN_IMAGES_FILE), "{err}");
}

#[test]
fn truncated_payload() {
    let dir = valid_dir("truncated");
    let mut images = valid_images(5);
    images.truncate(images.len() - 100);
    dir.write(TRAIN_IMAGES_FILE, &gzip(&images));
    let err = load_error(&dir, TRAIN_IMAGES_FILE);
    assert!(err.to_string().contains("truncated"), "{err}");
    let full_len = 16 + 5 * IMAGE_SIZE as u64;
    match err {
        DataError::Truncated {
            expected, found, ..
        } => assert_eq!((expected, found), (full_len, full_len - 100)),
        other => panic!("expected Truncated, got {other:?}"),
    }
}

#[test]
fn truncated_gzip_file() {
    let dir = valid_dir("truncated-gzip");
    let compressed = gzip(&valid_images(3));
    dir.write(TEST_IMAGES_FILE, &compressed[..compressed.len() / 2]);
    let err = load_error(&dir, TEST_IMAGES_FILE);
    assert!(matches!(err, DataError::CorruptGzip { .. }), "{err:?}");
}

#[test]
fn trailing_data() {
    let dir = valid_dir("trailing");
    let mut labels = valid_labels(5);
    labels.extend_from_slice(b"garbage");
    dir.write(TRAIN_LABELS_FILE, &gzip(&labels));
    let err = load_error(&dir, TRAIN_LABELS_FILE);
    assert!(
        matches!(err, DataError::TrailingData { expected: 13, .. }),
        "{err:?}"
    );
}

#[test]
fn bad_magic() {
    let dir = valid_dir("bad-magic");
    // A labels file where the images file should be: a plausible mix-up.
    dir.write(TRAIN_IMAGES_FILE, &gzip(&valid_labels(5)));
    let err = load_error(&dir, TRAIN_IMAGES_FILE);
    assert!(
        matches!(
            err,
            DataError::BadMagic {
                found: LABELS_MAGIC,
                expected: IMAGES_MAGIC,
                ..
            }
        ),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains("0x00000801") && message.contains("0x00000803"),
        "{message}"
    );
}

#[test]
fn not_gzip_at_all() {
    let dir = valid_dir("not-gzip");
    // The right content, but uncompressed: e.g. someone ran gunzip and renamed it back.
    dir.write(TEST_LABELS_FILE, &valid_labels(3));
    let err = load_error(&dir, TEST_LABELS_FILE);
    assert!(matches!(err, DataError::CorruptGzip { .. }), "{err:?}");
    assert!(err.to_string().contains("gzip"), "{err}");
}

#[test]
fn image_and_label_counts_differ() {
    let dir = valid_dir("count-mismatch");
    dir.write(TRAIN_LABELS_FILE, &gzip(&valid_labels(4)));
    let err = load_error(&dir, TRAIN_LABELS_FILE);
    assert!(
        matches!(
            err,
            DataError::CountMismatch {
                image_count: 5,
                label_count: 4,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains(TRAIN_IMAGES_FILE), "{err}");
}

#[test]
fn label_out_of_range() {
    let dir = valid_dir("label-range");
    dir.write(TEST_LABELS_FILE, &gzip(&idx_labels(&[0, 9, 10])));
    let err = load_error(&dir, TEST_LABELS_FILE);
    assert!(
        matches!(
            err,
            DataError::LabelOutOfRange {
                index: 2,
                label: 10,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn wrong_image_dimensions() {
    let dir = valid_dir("dimensions");
    // A consistent file of 32x32 images (CIFAR-sized), so only the dimensions are wrong.
    let images = idx_images(IMAGES_MAGIC, 3, 32, 32, &[0; 3 * 32 * 32]);
    dir.write(TEST_IMAGES_FILE, &gzip(&images));
    let err = load_error(&dir, TEST_IMAGES_FILE);
    assert!(
        matches!(
            err,
            DataError::UnexpectedDimensions {
                rows: 32,
                cols: 32,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("32x32"), "{err}");
}

#[test]
fn a_split_without_examples_is_an_error_naming_its_files() {
    for (images, labels, split) in [
        (TRAIN_IMAGES_FILE, TRAIN_LABELS_FILE, "training"),
        (TEST_IMAGES_FILE, TEST_LABELS_FILE, "test"),
    ] {
        let dir = valid_dir(&format!("empty-{split}"));
        // Valid IDX files with a count of 0.
        dir.write(images, &gzip(&valid_images(0)));
        dir.write(labels, &gzip(&valid_labels(0)));
        let err = load_error(&dir, images);
        assert!(
            matches!(&err, DataError::Empty { split: s, labels_path, .. }
                if *s == split && *labels_path == dir.join(labels)),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!(
                "{} and {} hold no examples: the {split} split needs at least one",
                dir.join(images).display(),
                dir.join(labels).display()
            )
        );
    }
}
