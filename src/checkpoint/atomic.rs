//! Writing a file atomically: next to its destination, then renamed over it, so that a crash
//! leaves the old file or the new one, never a torn one.

use std::path::{Path, PathBuf};

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
    remove_stale_temporaries(path);
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

/// The temporary files `.NAME.tmp-PID` beside the checkpoint `path` (the directory's entries
/// whose names parse), with the PID of the process that wrote each.
pub fn temporaries(path: &Path) -> Vec<(PathBuf, u32)> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let Some(name) = path.file_name() else {
        return Vec::new();
    };
    let prefix = format!(".{}.tmp-", name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid = entry
                .file_name()
                .to_str()?
                .strip_prefix(&prefix)?
                .parse::<u32>()
                .ok()?;
            Some((entry.path(), pid))
        })
        .collect()
}

/// Whether the process `pid` may still be writing the temporary file `tmp`: it is this process,
/// or (on Linux, through `/proc`) a process that runs, is not a zombie (killed, not yet waited
/// for by its parent: it writes nothing more) and started before the file was last written (a
/// process started later got a PID the kernel reused). Elsewhere any PID may be.
pub fn writer_may_be_running(pid: u32, tmp: &Path) -> bool {
    if pid == std::process::id() || !cfg!(target_os = "linux") {
        return true;
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        // No such process (or `/proc` is not mounted, where nothing can be told: see below).
        return !Path::new("/proc/self").exists();
    };
    // `PID (COMM) STATE ...`: COMM may hold spaces and parentheses, the fields after it do not.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    if matches!(fields.first(), Some(&"Z") | Some(&"X")) {
        return false;
    }
    // Field 22, the start time in clock ticks after boot (USER_HZ, 100 on every Linux ABI).
    let started = fields.get(19).and_then(|t| t.parse::<u64>().ok());
    let boot = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("btime "))
            .and_then(|t| t.trim().parse::<u64>().ok())
    });
    let modified = std::fs::metadata(tmp)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
    match (started, boot, modified) {
        // A margin of 2 s for the rounding of `btime` and the ticks.
        (Some(ticks), Some(boot), Some(modified)) => boot + ticks / 100 <= modified.as_secs() + 2,
        _ => true,
    }
}

/// Removes the temporary files `.NAME.tmp-PID` that writes of the checkpoint `path` killed
/// before their rename left behind: those of processes that no longer write
/// ([`writer_may_be_running`]). Returns the files removed. `save` calls it before each write;
/// the CLI also when a run claims its `--save` file.
pub fn remove_stale_temporaries(path: &Path) -> Vec<PathBuf> {
    temporaries(path)
        .into_iter()
        .filter(|(tmp, pid)| !writer_may_be_running(*pid, tmp))
        .filter(|(tmp, _)| std::fs::remove_file(tmp).is_ok())
        .map(|(tmp, _)| tmp)
        .collect()
}
