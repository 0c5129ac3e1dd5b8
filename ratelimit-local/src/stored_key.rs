//! A stored map key: short keys in the table's own slot, long ones on the
//! heap.
//!
//! A lookup compares the caller's bytes with the stored key's. Kept on the
//! heap, the stored key is one more memory access the lookup waits for
//! after it has found the slot: with a million callers, a cache miss of
//! its own on most calls. Keys of up to [`INLINE`] bytes (in a named map
//! the policy name's four-byte number and a caller of up to 18 bytes: an
//! id, an IPv4 address or a short token, the limiter's namespace included)
//! are kept in the slot, in the cache line the lookup has just read, in
//! the same 24 bytes a boxed key's pointer and length take; longer ones
//! are boxed as before.
//!
//! `smallvec::SmallVec<[u8; 16]>` (with the workspace's `union` feature)
//! keeps 16 bytes in place in 24 (it keeps a capacity, which a key that
//! never grows does not need); this keeps 22.

use std::fmt;
use std::ops::Deref;

/// The longest key kept in the slot.
pub(crate) const INLINE: usize = 22;

/// A stored map key: 24 bytes, the key's bytes in place up to [`INLINE`].
pub(crate) enum StoredKey {
    /// `len` bytes of `bytes`.
    Inline { len: u8, bytes: [u8; INLINE] },
    /// A longer key.
    Heap(Box<[u8]>),
}

impl StoredKey {
    /// The key made of `parts`, in order.
    pub(crate) fn from_parts(parts: &[&[u8]]) -> Self {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > INLINE {
            return Self::Heap(parts.concat().into_boxed_slice());
        }
        let mut bytes = [0u8; INLINE];
        let mut at = 0;
        for p in parts {
            bytes[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        Self::Inline {
            // `len <= INLINE` (22): fits a byte.
            len: len as u8,
            bytes,
        }
    }
}

impl Deref for StoredKey {
    type Target = [u8];

    #[inline(always)]
    fn deref(&self) -> &[u8] {
        match self {
            // `len <= INLINE` by construction; `get` keeps the compiler
            // from needing a panic path for it.
            Self::Inline { len, bytes } => bytes.get(..usize::from(*len)).unwrap_or(bytes),
            Self::Heap(b) => b,
        }
    }
}

impl fmt::Debug for StoredKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("StoredKey")
            .field(&String::from_utf8_lossy(self))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_key_takes_24_bytes() {
        assert_eq!(std::mem::size_of::<StoredKey>(), 24);
    }

    #[test]
    fn keys_up_to_the_inline_length_stay_in_place_and_every_key_reads_back() {
        for len in 0..=INLINE + 10 {
            let key: Vec<u8> = (0..len).map(|i| i as u8 ^ 0xA5).collect();
            for split in [0, len / 3, len] {
                let s = StoredKey::from_parts(&[&key[..split], &key[split..]]);
                assert_eq!(&*s, &key[..], "len {len}, split {split}");
                assert_eq!(matches!(s, StoredKey::Inline { .. }), len <= INLINE);
            }
        }
    }
}
