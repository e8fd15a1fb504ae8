//! The claim on a run's `--save` path: one run writes a checkpoint file at a time.

use std::path::Path;

use crate::config::RunError;

/// Holds `--save PATH` for one run: a lock on `.NAME.lock` beside it, released when the
/// process ends, however it ends.
#[derive(Debug)]
pub struct SaveClaim {
    _lock: Option<std::fs::File>,
}

/// Claims `save` for this run. Refused (a usage error) while another process holds it: two
/// runs saving to one file would overwrite each other's epochs, each run's checkpoint a mix.
/// Returns the claim and warnings for stderr: the file exists and is not the checkpoint being
/// resumed (the first epoch will overwrite it), or a running process is writing it without
/// holding the lock (an older `typed-amp`).
pub fn claim_save_path(
    save: &Path,
    resume: Option<&Path>,
) -> Result<(SaveClaim, Vec<String>), RunError> {
    use std::io::{Read, Seek, Write};
    let dir = save
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = save
        .file_name()
        .ok_or_else(|| RunError::Usage(format!("--save {}: not a file name", save.display())))?
        .to_string_lossy()
        .into_owned();
    let mut warnings = Vec::new();
    let lock_path = dir.join(format!(".{name}.lock"));
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .ok();
    let lock = match lock {
        Some(mut file) => match file.try_lock() {
            Ok(()) => {
                // The holder's pid, for the message another run gets.
                let _ = file.set_len(0);
                let _ = write!(file, "{}", std::process::id());
                Some(file)
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file
                    .rewind()
                    .and_then(|()| file.read_to_string(&mut holder));
                let holder = holder.trim();
                return Err(RunError::Usage(format!(
                    "--save {}: another run{} is saving to this file; two runs saving to one file overwrite each other's epochs: choose another --save",
                    save.display(),
                    if holder.is_empty() {
                        String::new()
                    } else {
                        format!(" (process {holder})")
                    }
                )));
            }
            // A file system without locks: the other checks still run.
            Err(std::fs::TryLockError::Error(_)) => None,
        },
        None => None,
    };
    // Temporary files of writes killed before their rename: removed now (the lock says no
    // other typed-amp run is saving here), not only at this run's first save.
    typed_amp::checkpoint::remove_stale_temporaries(save);
    for (tmp, pid) in typed_amp::checkpoint::temporaries(save) {
        if pid != std::process::id() && typed_amp::checkpoint::writer_may_be_running(pid, &tmp) {
            warnings.push(format!(
                "{} belongs to process {pid}, which is running: another program may be writing {}",
                tmp.display(),
                save.display()
            ));
        }
    }
    let same_file = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    };
    if save.exists() && !resume.is_some_and(|r| same_file(save, r)) {
        warnings.push(format!(
            "--save {} already exists and is not the checkpoint being resumed: the first epoch will overwrite it",
            save.display()
        ));
    }
    Ok((SaveClaim { _lock: lock }, warnings))
}
