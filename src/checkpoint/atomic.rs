//! Writing a file atomically: next to its destination, then renamed over it, so that a crash
//! leaves the old file or the new one, never a torn one.

use std::path::Path;

use super::error::CheckpointError;

pub(super) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    use std::io::Write;
    let io = |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    };
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| {
        io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "a checkpoint path names a file",
        ))
    })?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    remove_stale_temporaries(dir, &name.to_string_lossy());
    let result = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(io)
}

/// Removes the temporary files `.NAME.tmp-PID` that writes of `NAME` killed before their rename
/// left behind: those of processes that no longer run (known on Linux, through `/proc`;
/// elsewhere nothing is removed).
pub(super) fn remove_stale_temporaries(dir: &Path, name: &str) {
    let prefix = format!(".{name}.tmp-");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(pid) = file_name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let running = pid == std::process::id()
            || !cfg!(target_os = "linux")
            || Path::new("/proc").join(pid.to_string()).exists();
        if !running {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}
