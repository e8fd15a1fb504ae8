//! Why a data set could not be loaded or used ([`DataError`]).

use std::io;
use std::path::PathBuf;

use crate::{TextSplit, CLASSES, IMAGES_MAGIC, IMAGE_SIDE};

/// Why a data set (Fashion-MNIST or a text corpus) could not be loaded or used. Every variant
/// about a file names the file.
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

    /// A directory holds no file of a text corpus.
    #[error("{}: no text files (*{suffix}) in this directory", .dir.display())]
    NoTextFiles {
        /// The directory.
        dir: PathBuf,
        /// How the names of the files looked for end ([`TEXT_FILE_SUFFIX`](crate::TEXT_FILE_SUFFIX)).
        suffix: &'static str,
    },

    /// A file of a text corpus holds a NUL byte: it is binary, or text in an encoding such as
    /// UTF-16 that the loader does not read.
    #[error("{}: not a text file: NUL byte at offset {offset}", .path.display())]
    NulByte {
        /// The file.
        path: PathBuf,
        /// Position of the first NUL byte.
        offset: usize,
    },

    /// A file of a text corpus is mostly control characters (line breaks, tabs and form feeds
    /// do not count): it is binary.
    #[error(
        "{}: not a text file: {control} of its {chars} characters are control characters",
        .path.display()
    )]
    ControlCharacters {
        /// The file.
        path: PathBuf,
        /// Its control characters.
        control: usize,
        /// All its characters.
        chars: usize,
    },

    /// A split of a text is shorter than one window: `context` inputs and the target after
    /// them.
    #[error(
        "the {split} split holds {len} characters, fewer than one window of {} (context {context} + 1)",
        .context.saturating_add(1)
    )]
    TextTooShort {
        /// The split.
        split: TextSplit,
        /// Characters it holds.
        len: usize,
        /// The context length asked for.
        context: usize,
    },

    /// A window would run past the end of its split.
    #[error(
        "window start {start} is out of range: windows of {context} + 1 characters of the {split} split start at 0..={last}"
    )]
    WindowOutOfRange {
        /// The split.
        split: TextSplit,
        /// The start asked for.
        start: usize,
        /// The context length.
        context: usize,
        /// The last start a window fits at.
        last: usize,
    },

    /// A character to encode is not in the vocabulary.
    #[error(
        "character {character:?} ({}) at position {position} is not in the vocabulary of {vocab_size} characters",
        code_point(*.character)
    )]
    UnknownCharacter {
        /// The character.
        character: char,
        /// Its position in the text encoded, in characters.
        position: usize,
        /// Characters in the vocabulary.
        vocab_size: usize,
    },

    /// A checkpoint's vocabulary is not the data's: its token ids mean other characters.
    #[error(
        "the checkpoint's vocabulary ({saved_size} characters) differs from the data's ({data_size} characters): \
         at index {index} the checkpoint has {} and the data {}",
        show_char(*.saved),
        show_char(*.data)
    )]
    VocabMismatch {
        /// Characters in the checkpoint's vocabulary.
        saved_size: usize,
        /// Characters in the data's vocabulary.
        data_size: usize,
        /// The first index where they differ.
        index: usize,
        /// The checkpoint's character there (`None` past its end).
        saved: Option<char>,
        /// The data's character there (`None` past its end).
        data: Option<char>,
    },
}

/// `U+0041` for `'A'`.
fn code_point(c: char) -> String {
    format!("U+{:04X}", u32::from(c))
}

/// `'A' (U+0041)`, or `nothing (its vocabulary ends)`.
fn show_char(c: Option<char>) -> String {
    match c {
        Some(c) => format!("{c:?} ({})", code_point(c)),
        None => "nothing (its vocabulary ends)".to_string(),
    }
}
