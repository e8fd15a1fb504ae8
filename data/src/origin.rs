//! Where a data set was loaded from.

use std::path::PathBuf;

/// Which data a [`FashionMnist`](crate::FashionMnist) or a [`CharCorpus`](crate::CharCorpus) was loaded
/// from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataOrigin {
    /// Files in this directory (Fashion-MNIST's four files, or a corpus's text files).
    Directory(PathBuf),
    /// The subset compiled into this crate.
    Embedded,
}
