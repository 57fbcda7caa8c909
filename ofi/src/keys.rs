//! Registrations larger than the device's largest region. `fi_mr_reg` may
//! name any amount of memory, but a device registers at most its
//! `max_mr_size` in one region (rxe: 1 GiB - 4 KiB). A larger registration
//! is cut into device regions (*chunks*) and given one key of the
//! provider's own, a *compound* key: bit 63 set, which no device key (32
//! bits) has.
//!
//! A peer that meets a compound key for the first time asks the key's
//! owner for its chunks (the wire's `KeyQuery` and `KeyReply`) and keeps
//! the answer: an RMA or atomic through a compound key is then cut at the
//! chunk boundaries into device operations, each with its chunk's device
//! key, and the device checks each against its region as for any key. A
//! compound key is never given out twice by a domain, so a kept answer
//! cannot name another registration's chunks.
//!
//! Any key may also carry [`READABLE`], which says what the registration
//! lets peers do; the key itself is the rest.
//!
//! Chunk boundaries fall on pages: each chunk, rounded out to whole pages
//! (a device pins whole pages, and rxe's limit counts them), is at most
//! the device's limit.
#![forbid(unsafe_code)]

/// The bit that marks a compound key.
pub const COMPOUND: u64 = 1 << 63;

/// The bit set on every key, device or compound, whose registration lets
/// peers read it. A peer's delivery-complete write through such a key on
/// iWARP reads one byte of its target behind the write to learn that it
/// landed, instead of reading nothing (siw was seen to answer zero-length
/// reads with another read's length, breaking the connection).
pub const READABLE: u64 = 1 << 62;

/// Whether `key` could be one of this provider's: compound, or a device
/// key (32 bits) with at most [`READABLE`] set besides.
pub fn well_formed(key: u64) -> bool {
    key & COMPOUND != 0 || key & !READABLE <= u64::from(u32::MAX)
}

/// The page size chunks are cut on.
pub const PAGE: u64 = 4096;

/// Bytes of one chunk on the wire: address (u64), length (u64), key (u32).
pub const CHUNK_BYTES: usize = 20;

/// One device region of a compound registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// Its first byte.
    pub addr: u64,
    /// Its length.
    pub len: u64,
    /// Its device key.
    pub rkey: u32,
}

/// One device operation of a transfer cut at chunk boundaries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Where it starts in the transfer.
    pub offset: u64,
    /// The target address.
    pub addr: u64,
    /// Its length.
    pub len: u64,
    /// The device key that reaches it.
    pub rkey: u32,
}

/// The ranges `len` bytes at `addr` are cut into so that each, rounded
/// out to whole pages, is at most `max` bytes (`max` of at least one
/// page). One range when it already fits.
pub fn cut(addr: u64, len: u64, max: u64) -> Vec<(u64, u64)> {
    let step = (max / PAGE * PAGE).max(PAGE);
    let end = addr.saturating_add(len);
    let mut out = Vec::new();
    let (mut start, mut bound) = (addr, addr / PAGE * PAGE);
    while start < end {
        bound = bound.saturating_add(step);
        let next = bound.min(end);
        out.push((start, next - start));
        start = next;
    }
    out
}

/// Whether a region of `len` bytes at `addr` fits one device region of at
/// most `max` bytes (rounded out to whole pages, as a device pins them).
pub fn fits(addr: u64, len: u64, max: u64) -> bool {
    let lo = addr / PAGE * PAGE;
    let hi = addr.saturating_add(len).div_ceil(PAGE) * PAGE;
    hi - lo <= max
}

/// `len` bytes at `addr` cut at `chunks`' boundaries, each piece with its
/// chunk's key; or why not: some byte lies outside every chunk.
pub fn pieces(chunks: &[Chunk], addr: u64, len: u64) -> Result<Vec<Piece>, String> {
    let end = addr
        .checked_add(len)
        .ok_or_else(|| format!("{len} bytes at {addr:#x} wrap the address space"))?;
    let mut out = Vec::new();
    let mut at = addr;
    while at < end {
        let c = chunks
            .iter()
            .find(|c| c.addr <= at && at < c.addr + c.len)
            .ok_or_else(|| format!("{:#x} lies outside the registration", at))?;
        let next = (c.addr + c.len).min(end);
        out.push(Piece {
            offset: at - addr,
            addr: at,
            len: next - at,
            rkey: c.rkey,
        });
        at = next;
    }
    Ok(out)
}

/// Appends `chunks` in their wire form to `out`.
pub fn encode(chunks: &[Chunk], out: &mut Vec<u8>) {
    for c in chunks {
        out.extend_from_slice(&c.addr.to_le_bytes());
        out.extend_from_slice(&c.len.to_le_bytes());
        out.extend_from_slice(&c.rkey.to_le_bytes());
    }
}

/// Chunks from a peer's bytes, strictly: whole entries, at least one, each
/// of some length, in order and each starting where the last ended, none
/// wrapping the address space.
pub fn decode(b: &[u8]) -> Result<Vec<Chunk>, String> {
    if b.is_empty() || b.len() % CHUNK_BYTES != 0 {
        return Err(format!("{} bytes are no whole list of chunks", b.len()));
    }
    let word = |s: &[u8]| u64::from_le_bytes(s.try_into().expect("8 bytes"));
    let mut out: Vec<Chunk> = Vec::with_capacity(b.len() / CHUNK_BYTES);
    for e in b.chunks_exact(CHUNK_BYTES) {
        let c = Chunk {
            addr: word(&e[0..8]),
            len: word(&e[8..16]),
            rkey: u32::from_le_bytes(e[16..20].try_into().expect("4 bytes")),
        };
        if c.len == 0 || c.addr.checked_add(c.len).is_none() {
            return Err(format!("chunk of {} bytes at {:#x}", c.len, c.addr));
        }
        if let Some(last) = out.last() {
            if last.addr + last.len != c.addr {
                return Err(format!("chunk at {:#x} does not follow the last", c.addr));
            }
        }
        out.push(c);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: u64 = (1 << 30) - PAGE;

    #[test]
    fn a_region_that_fits_is_one_range() {
        assert_eq!(cut(0x1000, MAX, MAX), vec![(0x1000, MAX)]);
        assert!(fits(0x1000, MAX, MAX));
        assert!(!fits(0x1001, MAX, MAX), "one more page when rounded out");
    }

    #[test]
    fn each_range_rounded_out_to_pages_fits_the_device() {
        for (addr, len) in [
            (0x1234u64, (1u64 << 30) + 0x5000),
            (0x7f00_0000_0010, 3 * MAX + 17),
            (0x1000, 2 * MAX),
        ] {
            let r = cut(addr, len, MAX);
            assert!(r.len() > 1);
            assert_eq!(r[0].0, addr);
            let mut at = addr;
            for &(a, l) in &r {
                assert_eq!(a, at, "contiguous");
                assert!(l > 0 && fits(a, l, MAX), "{a:#x}+{l:#x}");
                at += l;
            }
            assert_eq!(at, addr + len, "covers it all");
            // Inner boundaries on pages: no page belongs to two chunks.
            for &(a, _) in &r[1..] {
                assert_eq!(a % PAGE, 0);
            }
        }
    }

    #[test]
    fn transfers_are_cut_at_chunk_boundaries() {
        let chunks = [
            Chunk {
                addr: 100,
                len: 4000,
                rkey: 1,
            },
            Chunk {
                addr: 4100,
                len: 8192,
                rkey: 2,
            },
            Chunk {
                addr: 12292,
                len: 10,
                rkey: 3,
            },
        ];
        assert_eq!(
            pieces(&chunks, 4000, 8300).unwrap(),
            vec![
                Piece {
                    offset: 0,
                    addr: 4000,
                    len: 100,
                    rkey: 1
                },
                Piece {
                    offset: 100,
                    addr: 4100,
                    len: 8192,
                    rkey: 2
                },
                Piece {
                    offset: 8292,
                    addr: 12292,
                    len: 8,
                    rkey: 3
                },
            ]
        );
        assert_eq!(pieces(&chunks, 200, 8).unwrap().len(), 1);
        assert!(pieces(&chunks, 99, 2).is_err(), "before the first");
        assert!(pieces(&chunks, 12300, 3).is_err(), "past the last");
        assert!(pieces(&chunks, u64::MAX, 2).is_err(), "wraps");
    }

    #[test]
    fn chunks_round_trip_and_bad_lists_are_refused() {
        let chunks = vec![
            Chunk {
                addr: 0x1000,
                len: 0x2000,
                rkey: 7,
            },
            Chunk {
                addr: 0x3000,
                len: 5,
                rkey: u32::MAX,
            },
        ];
        let mut b = Vec::new();
        encode(&chunks, &mut b);
        assert_eq!(b.len(), 2 * CHUNK_BYTES);
        assert_eq!(decode(&b).unwrap(), chunks);
        assert!(decode(&[]).is_err(), "empty");
        assert!(decode(&b[..CHUNK_BYTES + 1]).is_err(), "cut short");
        let gap = [
            chunks[0],
            Chunk {
                addr: 0x3001,
                ..chunks[1]
            },
        ];
        let mut g = Vec::new();
        encode(&gap, &mut g);
        assert!(decode(&g).is_err(), "a gap");
        let mut z = Vec::new();
        encode(
            &[Chunk {
                len: 0,
                ..chunks[0]
            }],
            &mut z,
        );
        assert!(decode(&z).is_err(), "empty chunk");
        let mut w = Vec::new();
        encode(
            &[Chunk {
                addr: u64::MAX,
                len: 2,
                rkey: 1,
            }],
            &mut w,
        );
        assert!(decode(&w).is_err(), "wraps");
    }
}
