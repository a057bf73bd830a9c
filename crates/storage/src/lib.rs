//! Local persistent storage as an RDMA endpoint (issue 4).
//!
//! This crate holds the store's on-disk layout ([`layout`]) and its
//! management API ([`Store`]): initialise a file or block device with a
//! checksummed superblock and a partition table, show it, and grant or
//! revoke principals' rights per partition; and the endpoint
//! ([`endpoint`]) that exposes the partitions as memory regions to RDMA
//! Writes, Reads and Flushes, locally or through a storage target.
//!
//! Every change is validated in full before a byte is written, and written
//! as a new generation of the metadata over the older of its two copies,
//! then synced: an invalid request leaves the device untouched, and a crash
//! mid-update leaves the previous generation readable. Updates take an
//! exclusive `flock` on the device, so two administrators cannot lose each
//! other's changes.

pub mod endpoint;
pub mod layout;
mod target;
mod uring;
pub mod wire;

use layout::{Grant, Layout, LayoutError, Partition, Principal, Rights, META_LEN};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::{Path, PathBuf};

/// Errors of the management API.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// An I/O error on the device.
    #[error("{path}: {err}")]
    Io {
        /// Device.
        path: PathBuf,
        /// Cause.
        err: std::io::Error,
    },
    /// The layout or the metadata on the device is not acceptable.
    #[error("{path}: {err}")]
    Layout {
        /// Device.
        path: PathBuf,
        /// Cause.
        err: LayoutError,
    },
    /// `init` over an existing store without `force`.
    #[error(
        "{0}: already holds a softrdma store (use --force to re-initialise and lose its data)"
    )]
    AlreadyInitialised(PathBuf),
    /// `init` over a device whose metadata area holds foreign data.
    #[error(
        "{0}: its first MiB holds data that is not a softrdma store (use --force to overwrite it)"
    )]
    NotEmpty(PathBuf),
    /// Requested size beyond a block device.
    #[error("{path}: size {size} is larger than the device ({device} bytes)")]
    TooLarge {
        /// Device.
        path: PathBuf,
        /// Requested.
        size: u64,
        /// Available.
        device: u64,
    },
    /// No size given for a file that does not exist or is empty.
    #[error("{0}: give a size (--size) for a new or empty file")]
    NoSize(PathBuf),
    /// Neither a regular file nor a block device.
    #[error("{0}: not a regular file or block device")]
    NotADevice(PathBuf),
    /// A partition selector that matches none.
    #[error("no partition {0:?} (give its index or name)")]
    NoSuchPartition(String),
    /// A principal that does not exist.
    #[error("no principal {0:?}")]
    NoSuchPrincipal(String),
    /// A malformed size or layout specification.
    #[error("{0}")]
    BadSpec(String),
}

type Result<T> = std::result::Result<T, StorageError>;

/// How `init` divides the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartitionSpec {
    /// N equal partitions filling the space after the metadata (each
    /// rounded down to the alignment).
    Equal(usize),
    /// Explicit partitions, in index order.
    Layout(Vec<PartSpec>),
}

/// One partition of a `--layout`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartSpec {
    /// Name (may be empty).
    pub name: String,
    /// Size, or `None` for "the rest" (up to the end of the store).
    pub size: Option<u64>,
    /// Offset, or `None` for "right after the previous partition" (aligned
    /// up).
    pub offset: Option<u64>,
}

/// Parameters of [`Store::init`].
#[derive(Debug, Clone)]
pub struct InitOptions {
    /// Store size; `None`: the whole block device, or the file's current
    /// size.
    pub size: Option<u64>,
    /// Partitioning.
    pub partitions: PartitionSpec,
    /// Partition alignment.
    pub align: u64,
    /// Overwrite an existing store or foreign data.
    pub force: bool,
}

impl Default for InitOptions {
    fn default() -> Self {
        InitOptions {
            size: None,
            partitions: PartitionSpec::Equal(1),
            align: layout::DEFAULT_ALIGN,
            force: false,
        }
    }
}

/// Parses a byte size: `4096`, `64K`, `64KiB`, `1M`, `1MiB`, `2G`, `1T`
/// (binary multiples).
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("bad size {s:?}: expected a number with an optional unit"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" | "kb" => 1 << 10,
        "m" | "mib" | "mb" => 1 << 20,
        "g" | "gib" | "gb" => 1 << 30,
        "t" | "tib" | "tb" => 1 << 40,
        u => return Err(format!("bad size {s:?}: unknown unit {u:?}")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("bad size {s:?}: too large"))
}

/// Parses a `--layout` spec: comma-separated `[NAME=]SIZE[@OFFSET]`, where
/// SIZE may be `rest`. Example: `meta=64MiB,data=rest`,
/// `16MiB@1MiB,16MiB@32MiB`.
pub fn parse_layout(spec: &str) -> std::result::Result<Vec<PartSpec>, String> {
    let mut out = Vec::new();
    for item in spec.split(',').map(str::trim) {
        if item.is_empty() {
            return Err(format!("empty partition in layout {spec:?}"));
        }
        let (name, rest) = match item.split_once('=') {
            Some((n, r)) => (n.trim().to_string(), r.trim()),
            None => (String::new(), item),
        };
        let (size, offset) = match rest.split_once('@') {
            Some((s, o)) => (s.trim(), Some(parse_size(o)?)),
            None => (rest, None),
        };
        let size = if size == "rest" {
            None
        } else {
            Some(parse_size(size)?)
        };
        out.push(PartSpec { name, size, offset });
    }
    if let Some(i) = out[..out.len() - 1].iter().position(|p| p.size.is_none()) {
        return Err(format!(
            "partition {i}: only the last partition may be `rest`"
        ));
    }
    Ok(out)
}

/// An opened store: its device and the metadata read from it.
#[derive(Debug)]
pub struct Store {
    path: PathBuf,
    file: File,
    layout: Layout,
    damaged: Vec<usize>,
    device_len: u64,
    block_device: bool,
}

impl Store {
    /// Initialises `path` (a regular file, created or grown to the size,
    /// or a block device) as a store. Validates everything first; on any
    /// error nothing is created or written.
    pub fn init(path: &Path, o: &InitOptions) -> Result<Store> {
        let io = |err| StorageError::Io {
            path: path.to_path_buf(),
            err,
        };
        let lerr = |err| StorageError::Layout {
            path: path.to_path_buf(),
            err,
        };
        let existing = match std::fs::metadata(path) {
            Ok(m) => Some(m),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io(e)),
        };
        let block = existing
            .as_ref()
            .is_some_and(|m| m.file_type().is_block_device());
        if let Some(m) = &existing {
            if !block && !m.is_file() {
                return Err(StorageError::NotADevice(path.to_path_buf()));
            }
        }
        // Size and the current contents of the metadata area.
        let (current_len, meta) = match &existing {
            Some(_) => {
                let f = File::open(path).map_err(io)?;
                let len = device_len(&f, block).map_err(io)?;
                (len, read_meta(&f, len).map_err(io)?)
            }
            None => (0, Vec::new()),
        };
        let size = match (o.size, block) {
            (Some(s), true) if s > current_len => {
                return Err(StorageError::TooLarge {
                    path: path.to_path_buf(),
                    size: s,
                    device: current_len,
                })
            }
            (Some(s), _) => s,
            (None, _) if current_len > 0 => current_len,
            (None, _) => return Err(StorageError::NoSize(path.to_path_buf())),
        };
        if !o.force {
            match Layout::read(&meta) {
                Ok(_) | Err(LayoutError::Corrupt(_)) | Err(LayoutError::Version(_)) => {
                    return Err(StorageError::AlreadyInitialised(path.to_path_buf()))
                }
                Err(_) if meta.iter().any(|&b| b != 0) => {
                    return Err(StorageError::NotEmpty(path.to_path_buf()))
                }
                Err(_) => {}
            }
        }
        let layout = plan(size, o, random_id().map_err(io)?).map_err(lerr)?;
        // Valid: now write. Files are created or grown (never shrunk: a
        // smaller --size leaves the bytes past the store alone).
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(!block)
            .truncate(false)
            .open(path)
            .map_err(io)?;
        let _lock = Flock::exclusive(&file).map_err(io)?;
        if !block && current_len < size {
            file.set_len(size).map_err(io)?;
        }
        let copy = layout.encode();
        // Both copies hold generation 1; the next update overwrites copy 0.
        file.write_all_at(&copy, layout::COPY_LEN).map_err(io)?;
        file.write_all_at(&copy, 0).map_err(io)?;
        file.sync_all().map_err(io)?;
        let device_len = device_len(&file, block).map_err(io)?;
        Ok(Store {
            path: path.to_path_buf(),
            file,
            layout,
            damaged: Vec::new(),
            device_len,
            block_device: block,
        })
    }

    /// Opens an initialised store for reading its metadata and updating
    /// it. A foreign or corrupt device is an error; one damaged copy is
    /// tolerated (and reported by [`Store::damaged_copies`]).
    pub fn open(path: &Path) -> Result<Store> {
        let io = |err| StorageError::Io {
            path: path.to_path_buf(),
            err,
        };
        let m = std::fs::metadata(path).map_err(io)?;
        let block = m.file_type().is_block_device();
        if !block && !m.is_file() {
            return Err(StorageError::NotADevice(path.to_path_buf()));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .or_else(|_| File::open(path))
            .map_err(io)?;
        let len = device_len(&file, block).map_err(io)?;
        // Shared lock: an update in progress is never half-read.
        let lock = Flock::shared(&file).map_err(io)?;
        let meta = read_meta(&file, len).map_err(io)?;
        drop(lock);
        let (layout, damaged) = Layout::read(&meta).map_err(|err| StorageError::Layout {
            path: path.to_path_buf(),
            err,
        })?;
        if layout.device_size > len {
            return Err(StorageError::Layout {
                path: path.to_path_buf(),
                err: LayoutError::Corrupt(format!(
                    "the superblock says {} bytes but the device has {len}",
                    layout.device_size
                )),
            });
        }
        Ok(Store {
            path: path.to_path_buf(),
            file,
            layout,
            damaged,
            device_len: len,
            block_device: block,
        })
    }

    /// The metadata.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The device's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open device (the endpoint does its I/O on it).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Bytes on the device (at least the store's size).
    pub fn device_len(&self) -> u64 {
        self.device_len
    }

    /// Whether the device is a block device.
    pub fn is_block_device(&self) -> bool {
        self.block_device
    }

    /// Metadata copies that were damaged when the store was opened (the
    /// other copy was used; the next update rewrites the older copy).
    pub fn damaged_copies(&self) -> &[usize] {
        &self.damaged
    }

    /// The metadata as it is on the device now, if it differs from what
    /// `known` stamped: another process (`storage grant`, `revoke`) may
    /// have updated it since this store was opened. `None`: unchanged.
    ///
    /// Read under a shared `flock`, the counterpart of the exclusive one
    /// every update holds while it writes and syncs: no update is ever
    /// half-read, and of the two copies the valid one with the higher
    /// generation is taken (a copy damaged some other way is skipped, as
    /// at open). The stamp alone (each copy's header and checksum, two
    /// small reads per copy) decides whether anything changed, so asking
    /// often is cheap; every update changes it (a new generation, and a
    /// new checksum). The returned layout does not replace
    /// [`Store::layout`], which stays as read at open.
    pub fn reload(&self, known: Option<&MetaStamp>) -> Result<Option<(MetaStamp, Layout)>> {
        let io = |err| StorageError::Io {
            path: self.path.clone(),
            err,
        };
        let _lock = Flock::shared(&self.file).map_err(io)?;
        let stamp = MetaStamp::read(&self.file, self.device_len).map_err(io)?;
        if known == Some(&stamp) {
            return Ok(None);
        }
        let meta = read_meta(&self.file, self.device_len).map_err(io)?;
        let (layout, _) = Layout::read(&meta).map_err(|err| StorageError::Layout {
            path: self.path.clone(),
            err,
        })?;
        if layout.device_size > self.device_len {
            return Err(StorageError::Layout {
                path: self.path.clone(),
                err: LayoutError::Corrupt(format!(
                    "the superblock says {} bytes but the device has {}",
                    layout.device_size, self.device_len
                )),
            });
        }
        Ok(Some((stamp, layout)))
    }

    /// The index of the partition `sel` names: its index or its name.
    pub fn partition(&self, sel: &str) -> Result<u32> {
        let parts = &self.layout.partitions;
        if let Ok(i) = sel.parse::<usize>() {
            if i < parts.len() {
                return Ok(i as u32);
            }
        }
        parts
            .iter()
            .position(|p| !p.name.is_empty() && p.name == sel)
            .map(|i| i as u32)
            .ok_or_else(|| StorageError::NoSuchPartition(sel.to_string()))
    }

    /// Gives `principal` the `rights` on partition `part` (in addition to
    /// what it has). A new principal is created with a fresh random token,
    /// which is returned (the only time it is shown unasked).
    pub fn grant(
        &mut self,
        part: &str,
        principal: &str,
        rights: Rights,
    ) -> Result<Option<[u8; 32]>> {
        let p = self.partition(part)?;
        let path = self.path.clone();
        self.update(|next| {
            let mut token = None;
            let q = match next.principal(principal) {
                Some(q) => q,
                None => {
                    let t = random_token().map_err(|err| StorageError::Io { path, err })?;
                    next.principals.push(Principal {
                        name: principal.to_string(),
                        token: t,
                    });
                    token = Some(t);
                    (next.principals.len() - 1) as u32
                }
            };
            match next
                .grants
                .iter_mut()
                .find(|g| g.partition == p && g.principal == q)
            {
                Some(g) => g.rights = g.rights.with(rights),
                None => next.grants.push(Grant {
                    partition: p,
                    principal: q,
                    rights,
                }),
            }
            Ok(token)
        })
    }

    /// Takes `rights` on partition `part` away from `principal`.
    pub fn revoke(&mut self, part: &str, principal: &str, rights: Rights) -> Result<()> {
        let p = self.partition(part)?;
        self.update(|next| {
            let q = next
                .principal(principal)
                .ok_or_else(|| StorageError::NoSuchPrincipal(principal.to_string()))?;
            if let Some(i) = next
                .grants
                .iter()
                .position(|g| g.partition == p && g.principal == q)
            {
                let left = next.grants[i].rights.without(rights);
                if left.is_empty() {
                    next.grants.remove(i);
                } else {
                    next.grants[i].rights = left;
                }
            }
            Ok(())
        })
    }

    /// The token of `principal`.
    pub fn token(&self, principal: &str) -> Result<[u8; 32]> {
        let q = self
            .layout
            .principal(principal)
            .ok_or_else(|| StorageError::NoSuchPrincipal(principal.to_string()))?;
        Ok(self.layout.principals[q as usize].token)
    }

    /// One metadata update: under the device's exclusive lock, re-reads
    /// the metadata (another process may have changed it since open),
    /// applies `change`, validates the result and writes it as the next
    /// generation over the older copy, then syncs. Nothing is written if
    /// `change` or the validation fails; the lock is released either way.
    fn update<T>(&mut self, change: impl FnOnce(&mut Layout) -> Result<T>) -> Result<T> {
        let io = |err| StorageError::Io {
            path: self.path.clone(),
            err,
        };
        let lerr = |err| StorageError::Layout {
            path: self.path.clone(),
            err,
        };
        let _lock = Flock::exclusive(&self.file).map_err(io)?;
        let meta = read_meta(&self.file, self.device_len).map_err(io)?;
        let (mut next, _) = Layout::read(&meta).map_err(lerr)?;
        let out = change(&mut next)?;
        next.generation += 1;
        next.validate().map_err(lerr)?;
        let at = Layout::slot(next.generation) * layout::COPY_LEN;
        self.file.write_all_at(&next.encode(), at).map_err(io)?;
        self.file.sync_data().map_err(io)?;
        self.layout = next;
        self.damaged.clear();
        Ok(out)
    }
}

/// Lays out the partitions of a new store.
fn plan(
    size: u64,
    o: &InitOptions,
    store_id: [u8; 16],
) -> std::result::Result<Layout, LayoutError> {
    let align = o.align;
    if !align.is_power_of_two() || align < layout::MIN_ALIGN {
        return Err(LayoutError::BadAlign(align));
    }
    let first = META_LEN.div_ceil(align) * align;
    if size < first + align {
        return Err(LayoutError::TooSmall { size });
    }
    let mut partitions = Vec::new();
    match &o.partitions {
        PartitionSpec::Equal(n) => {
            if *n == 0 {
                return Err(LayoutError::NoPartitions);
            }
            if *n > layout::MAX_PARTITIONS {
                return Err(LayoutError::TooMany {
                    what: "partitions",
                    n: *n,
                    max: layout::MAX_PARTITIONS,
                });
            }
            let each = (size - first) / *n as u64 / align * align;
            if each == 0 {
                return Err(LayoutError::TooSmall { size });
            }
            for i in 0..*n as u64 {
                partitions.push(Partition {
                    name: String::new(),
                    offset: first + i * each,
                    size: each,
                });
            }
        }
        PartitionSpec::Layout(specs) => {
            let mut next = first;
            for (i, s) in specs.iter().enumerate() {
                let offset = s.offset.unwrap_or(next.div_ceil(align) * align);
                let size = match s.size {
                    Some(z) => z,
                    None if i + 1 == specs.len() => (size.saturating_sub(offset)) / align * align,
                    None => return Err(LayoutError::RestNotLast(i)),
                };
                partitions.push(Partition {
                    name: s.name.clone(),
                    offset,
                    size,
                });
                next = offset.saturating_add(size);
            }
        }
    }
    let l = Layout {
        store_id,
        generation: 1,
        device_size: size,
        align,
        partitions,
        principals: Vec::new(),
        grants: Vec::new(),
    };
    l.validate()?;
    Ok(l)
}

fn device_len(f: &File, block: bool) -> std::io::Result<u64> {
    if !block {
        return Ok(f.metadata()?.len());
    }
    let mut n: u64 = 0;
    // BLKGETSIZE64 = _IOR(0x12, 114, size_t)
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    // SAFETY: the ioctl writes one u64 through the pointer, which is valid.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), BLKGETSIZE64 as _, &mut n as *mut u64) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n)
}

fn read_meta(f: &File, len: u64) -> std::io::Result<Vec<u8>> {
    let n = len.min(META_LEN) as usize;
    let mut b = vec![0u8; n];
    f.read_exact_at(&mut b, 0)?;
    Ok(b)
}

fn random_bytes(b: &mut [u8]) -> std::io::Result<()> {
    let mut at = 0;
    while at < b.len() {
        // SAFETY: writes at most b.len() - at bytes into b[at..].
        let r = unsafe { libc::getrandom(b[at..].as_mut_ptr().cast(), b.len() - at, 0) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        at += r as usize;
    }
    Ok(())
}

fn random_id() -> std::io::Result<[u8; 16]> {
    let mut b = [0u8; 16];
    random_bytes(&mut b)?;
    Ok(b)
}

fn random_token() -> std::io::Result<[u8; 32]> {
    let mut b = [0u8; 32];
    random_bytes(&mut b)?;
    Ok(b)
}

/// What identifies the metadata on a device as it is now: each copy's
/// header (magic, version, length, store id, generation) and checksum.
/// Any update changes it (see [`Store::reload`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaStamp(Vec<u8>);

impl MetaStamp {
    /// Header bytes per copy in the stamp (up to and with the generation).
    const HEAD: usize = 40;

    fn read(f: &File, len: u64) -> std::io::Result<MetaStamp> {
        let mut v = Vec::with_capacity(2 * (Self::HEAD + 4));
        for copy in 0..2u64 {
            let base = copy * layout::COPY_LEN;
            let mut head = [0u8; Self::HEAD];
            if base + Self::HEAD as u64 <= len {
                f.read_exact_at(&mut head, base)?;
            }
            let clen = u32::from_le_bytes(head[12..16].try_into().expect("4 bytes")) as u64;
            let mut crc = [0u8; 4];
            if clen + 4 <= layout::COPY_LEN && base + clen + 4 <= len {
                f.read_exact_at(&mut crc, base + clen)?;
            }
            v.extend_from_slice(&head);
            v.extend_from_slice(&crc);
        }
        Ok(MetaStamp(v))
    }
}

/// A `flock` on a device, released on drop (or when the process dies: the
/// kernel drops it with the descriptor). Updates hold it exclusive,
/// readers that must not see one half-written ([`Store::reload`]) shared.
struct Flock(std::os::fd::RawFd);

impl Flock {
    fn exclusive(f: &File) -> std::io::Result<Flock> {
        Flock::take(f, libc::LOCK_EX)
    }

    fn shared(f: &File) -> std::io::Result<Flock> {
        Flock::take(f, libc::LOCK_SH)
    }

    fn take(f: &File, how: libc::c_int) -> std::io::Result<Flock> {
        loop {
            // SAFETY: flock on a valid descriptor; no pointers.
            if unsafe { libc::flock(f.as_raw_fd(), how) } == 0 {
                return Ok(Flock(f.as_raw_fd()));
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

impl Drop for Flock {
    fn drop(&mut self) {
        // SAFETY: flock on the descriptor locked above, which the caller's
        // File keeps open for the guard's lifetime; no pointers.
        unsafe { libc::flock(self.0, libc::LOCK_UN) };
    }
}

/// Hex form of a token or store id.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Parses the hex form of a token.
pub fn parse_token(s: &str) -> std::result::Result<[u8; 32], String> {
    let s = s.trim();
    if s.len() != 64 || !s.is_ascii() {
        return Err("a token is 64 hex digits".into());
    }
    let mut t = [0u8; 32];
    for (i, b) in t.iter_mut().enumerate() {
        *b =
            u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| "a token is 64 hex digits")?;
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_layouts_parse() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert!(parse_size("12parsecs").is_err());
        assert!(parse_size("").is_err());
        let l = parse_layout("meta=64MiB, data=rest").unwrap();
        assert_eq!(l[0].name, "meta");
        assert_eq!(l[0].size, Some(64 << 20));
        assert_eq!(l[1].size, None);
        let l = parse_layout("16MiB@1MiB,16MiB@32MiB").unwrap();
        assert_eq!(l[1].offset, Some(32 << 20));
        assert!(parse_layout("a=1M,,b=2M").is_err());
        assert!(parse_layout("a=rest,b=2M").is_err());
    }

    #[test]
    fn plan_equal_and_explicit() {
        let o = InitOptions {
            partitions: PartitionSpec::Equal(3),
            ..Default::default()
        };
        let l = plan(100 << 20, &o, [1; 16]).unwrap();
        assert_eq!(l.partitions.len(), 3);
        assert!(l.partitions.iter().all(|p| p.size == 33 << 20));
        assert_eq!(l.partitions[0].offset, 1 << 20);
        let o = InitOptions {
            partitions: PartitionSpec::Layout(parse_layout("a=8M,b=rest").unwrap()),
            ..Default::default()
        };
        let l = plan(64 << 20, &o, [1; 16]).unwrap();
        assert_eq!(l.partitions[1].offset, 9 << 20);
        assert_eq!(l.partitions[1].size, 55 << 20);
    }

    /// A reader of the metadata while other handles (other open file
    /// descriptions, as other processes have) update it as fast as they
    /// can: every read gets a valid layout, never an older generation
    /// than one it saw, and the stamp notices changes. (A smoke test: it
    /// passes without the shared lock too, since a torn copy fails its
    /// checksum and the other copy is used; the lock closes the rare
    /// window where one read meets two updates and finds both copies
    /// torn.)
    #[test]
    fn reading_while_others_update_is_safe() {
        let p = std::env::temp_dir().join(format!("softrdma-reload-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        let o = InitOptions {
            size: Some(8 << 20),
            partitions: PartitionSpec::Equal(4),
            ..Default::default()
        };
        Store::init(&p, &o).unwrap();
        Store::open(&p)
            .unwrap()
            .grant("0", "a", Rights::READ)
            .unwrap();
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let stop = AtomicBool::new(false);
        // The reader's reads so far, and the writers done: each writer
        // waits for a new read every 10 updates, so reads and updates
        // overlap whatever the scheduler does (a loaded CI machine once
        // gave 75 reads and 1 change while the writers ran on their own),
        // and the reader stops once both are done.
        let (reads_done, finished) = (AtomicU64::new(0), AtomicU64::new(0));
        let reader = Store::open(&p).unwrap();
        std::thread::scope(|sc| {
            for w in 0..2 {
                let (p, stop, reads_done, finished) = (&p, &stop, &reads_done, &finished);
                sc.spawn(move || {
                    let mut s = Store::open(p).unwrap();
                    for i in 0..150u64 {
                        while reads_done.load(Ordering::Acquire) < i / 10 {
                            std::thread::yield_now();
                        }
                        let part = ((i + w) % 4).to_string();
                        s.grant(&part, "a", Rights::WRITE).unwrap();
                        s.revoke(&part, "a", Rights::WRITE).unwrap();
                    }
                    if finished.fetch_add(1, Ordering::AcqRel) == 1 {
                        stop.store(true, Ordering::Release);
                    }
                });
            }
            let (mut last, mut stamp, mut reads, mut changes) = (0, None, 0, 0);
            while !stop.load(Ordering::Acquire) {
                // A full read each time, and one through the stamp.
                let (_, l) = reader.reload(None).unwrap().expect("a layout");
                assert!(
                    l.generation >= last,
                    "generation {} after {last}",
                    l.generation
                );
                last = l.generation;
                if let Some((st, l)) = reader.reload(stamp.as_ref()).unwrap() {
                    assert!(l.generation >= last);
                    stamp = Some(st);
                    changes += 1;
                }
                Store::open(&p).unwrap();
                reads += 1;
                reads_done.store(reads, Ordering::Release);
            }
            // Each writer waited for 14 reads, each after updates.
            assert!(
                reads >= 14 && changes > 1,
                "{reads} reads, {changes} changes"
            );
        });
        let (_, l) = reader.reload(None).unwrap().unwrap();
        assert_eq!(l.generation, 2 + 2 * 2 * 150);
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn tokens_round_trip() {
        let t = random_token().unwrap();
        assert_eq!(parse_token(&hex(&t)), Ok(t));
        assert!(parse_token("zz").is_err());
    }
}
