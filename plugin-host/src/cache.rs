//! The on-disk cache of compiled plugins (`runtime.cache_dir`), so a restart does not
//! recompile: a Python plugin takes seconds to compile, a Rust one ~100 ms.
//!
//! An entry is keyed by the component's SHA-256 and the engine's compatibility hash (wasmtime
//! version and every setting that affects code generation), and carries the SHA-256 of the
//! compiled bytes beside it, checked before use. Anything missing, stale or mismatched is
//! a miss: the plugin is compiled and the entry rewritten.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};

use wasmtime::component::Component;

use super::loader::sha256_hex;
use super::runtime::Runtime;

#[derive(Debug, Clone)]
pub struct DiskCache {
    dir: PathBuf,
}

impl DiskCache {
    /// The cache in `dir`, created private to the server's user if missing. A directory
    /// that others could write to is refused (logged; the server then compiles instead):
    /// its files are run as native code.
    pub fn open(dir: &Path) -> Option<DiskCache> {
        match private_dir(dir) {
            Ok(()) => Some(DiskCache {
                dir: dir.to_path_buf(),
            }),
            Err(why) => {
                tracing::warn!(dir = %dir.display(), "compiled plugin cache not used: {why}");
                None
            }
        }
    }

    fn path(&self, runtime: &Runtime, sha: &str) -> PathBuf {
        let mut h = DefaultHasher::new();
        runtime
            .engine()
            .precompile_compatibility_hash()
            .hash(&mut h);
        self.dir.join(format!("{sha}-{:016x}.cwasm", h.finish()))
    }

    /// A previously compiled component for these bytes, if a valid entry exists.
    pub fn load(&self, runtime: &Runtime, sha: &str) -> Option<Component> {
        let path = self.path(runtime, sha);
        if let Err(why) = private_file(&path) {
            if path.exists() {
                tracing::warn!(path = %path.display(), "compiled plugin cache entry not used: {why}");
            }
            return None;
        }
        let bytes = std::fs::read(&path).ok()?;
        let recorded = std::fs::read_to_string(path.with_extension("sha256")).ok()?;
        if recorded.trim() != sha256_hex(&bytes) {
            tracing::warn!(path = %path.display(), "compiled plugin cache entry does not match its hash; recompiling");
            return None;
        }
        // SAFETY: `Component::deserialize` runs native code from the bytes, so they must be
        // what `Component::serialize` wrote on a compatible engine. They are: the entry is
        // written only by `store` below, in a directory the server owns, keyed by the
        // engine's compatibility hash, and its SHA-256 was checked above (wasmtime also
        // checks its own version and settings header and refuses a mismatch).
        #[allow(unsafe_code)]
        let component = unsafe { Component::deserialize(runtime.engine(), &bytes) };
        match component {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(path = %path.display(), "compiled plugin cache entry unusable ({e}); recompiling");
                None
            }
        }
    }

    /// Writes an entry (atomically: temporary files, named for this process so that nodes
    /// starting together on one directory do not take each other's, then renames).
    /// Failures are logged only.
    pub fn store(&self, runtime: &Runtime, sha: &str, component: &Component) {
        let path = self.path(runtime, sha);
        let result = (|| -> std::io::Result<()> {
            let bytes = component.serialize().map_err(std::io::Error::other)?;
            let pid = std::process::id();
            let sum = path.with_extension("sha256");
            let (tmp, tmp_sum) = (
                path.with_extension(format!("tmp.{pid}")),
                path.with_extension(format!("sha256.tmp.{pid}")),
            );
            write_private(&tmp, &bytes)?;
            write_private(&tmp_sum, sha256_hex(&bytes).as_bytes())?;
            std::fs::rename(&tmp_sum, &sum)?;
            std::fs::rename(&tmp, &path)
        })();
        if let Err(e) = result {
            tracing::warn!(dir = %self.dir.display(), "cannot write the compiled plugin cache: {e}");
        }
    }
}

/// The directory exists (created 0700 if not), belongs to this process's user and is not
/// writable by group or others.
fn private_dir(dir: &Path) -> Result<(), String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| format!("cannot create it: {e}"))?;
        }
    }
    #[cfg(not(unix))]
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create it: {e}"))?;
    private_file(dir)
}

/// Owned by this process's user and not writable by group or others (Unix; elsewhere
/// only existence is checked).
fn private_file(path: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if meta.mode() & 0o022 != 0 {
            return Err(format!(
                "it is writable by group or others (mode {:o})",
                meta.mode() & 0o777
            ));
        }
        // On Linux /proc/self belongs to the process's effective user.
        if let Ok(me) = std::fs::metadata("/proc/self")
            && me.uid() != meta.uid()
        {
            return Err(format!(
                "it belongs to user {}, not to the server's user {}",
                meta.uid(),
                me.uid()
            ));
        }
    }
    let _ = meta;
    Ok(())
}

/// Writes a file readable and writable by the server's user only (whatever the umask).
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let _ = std::fs::remove_file(path);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)?.write_all(bytes)
}
