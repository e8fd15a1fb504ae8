//! The IDX format, gzip-compressed, as Fashion-MNIST ships it: its parsers (the magic numbers
//! are `format.rs`'s).

use std::io::Read;
use std::path::Path;

use flate2::read::MultiGzDecoder;

use crate::error::DataError;
use crate::{Split, CLASSES, IMAGES_MAGIC, IMAGE_SIDE, IMAGE_SIZE, LABELS_MAGIC};

/// Parses a gzip-compressed IDX images file (the bytes of e.g. [`TRAIN_IMAGES_FILE`](crate::TRAIN_IMAGES_FILE)) into
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

/// Parses a gzip-compressed IDX labels file (the bytes of e.g. [`TRAIN_LABELS_FILE`](crate::TRAIN_LABELS_FILE)) into
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
