//! Helpers shared by the integration tests. Each test file is its own crate and uses only some
//! of them.
#![allow(dead_code)]

use std::ops::Deref;
use std::path::{Path, PathBuf};

/// A fresh directory under the system's temp dir, removed when dropped, so test runs leave
/// nothing behind.
pub struct TempDir(PathBuf);

impl TempDir {
    /// `typed-amp-test-<pid>-<name>`, emptied first: a leftover from an earlier run with the
    /// same pid would make a test lie.
    pub fn new(name: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("typed-amp-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create temp dir");
        Self(path)
    }

    /// Writes `bytes` to the file `name` in this directory.
    pub fn write(&self, name: &str, bytes: &[u8]) {
        std::fs::write(self.0.join(name), bytes).expect("write test file");
    }
}

impl Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
