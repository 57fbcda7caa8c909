//! A provider endpoint's address, as `fi_getname` returns it and
//! `fi_av_insert` takes it (FI_FORMAT_UNSPEC: opaque bytes the caller
//! exchanges out of band). It is the BTL's address of the endpoint's
//! domain ([`xrcbtl_btl::addr::Address`]: rank, listener, node, how it
//! receives) and the endpoint's number in that domain.
//!
//! Layout, little-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 4 | magic `XRFI` |
//! | 1 | version (1) |
//! | 2 | endpoint number in its domain |
//! | 2 | length n of the BTL address |
//! | n | the BTL address |
//!
//! Decoding is strict: a foreign or truncated address, another version, a
//! length that disagrees with the bytes, or a BTL address that does not
//! decode is refused with the reason, and `fi_av_insert` fails that entry.
#![forbid(unsafe_code)]

use xrcbtl_btl::addr::{Address, MAX_LEN as BTL_MAX_LEN};

const MAGIC: &[u8; 4] = b"XRFI";
/// The version this provider writes and reads.
pub const VERSION: u8 = 1;
const FIXED: usize = 4 + 1 + 2 + 2;
/// Longest encoded address (`fi_getname`'s buffer need never be larger).
pub const MAX_LEN: usize = FIXED + BTL_MAX_LEN;

/// An endpoint's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpAddr {
    /// Its domain's BTL address.
    pub domain: Address,
    /// The endpoint's number in its domain.
    pub ep: u16,
}

impl EpAddr {
    /// The bytes `fi_getname` returns; `None` where the BTL address cannot
    /// be encoded (an empty or overlong node key).
    pub fn encode(&self) -> Option<Vec<u8>> {
        let btl = self.domain.encode()?;
        let n = u16::try_from(btl.len()).ok()?;
        let mut b = Vec::with_capacity(FIXED + btl.len());
        b.extend_from_slice(MAGIC);
        b.push(VERSION);
        b.extend_from_slice(&self.ep.to_le_bytes());
        b.extend_from_slice(&n.to_le_bytes());
        b.extend_from_slice(&btl);
        Some(b)
    }

    /// Reads an address a caller inserts, or says why it is not one.
    pub fn decode(b: &[u8]) -> Result<EpAddr, String> {
        if b.len() < FIXED {
            return Err(format!(
                "{} bytes: shorter than an xrc provider address",
                b.len()
            ));
        }
        if &b[..4] != MAGIC {
            return Err("not an xrc provider address (bad magic)".into());
        }
        if b[4] != VERSION {
            return Err(format!(
                "provider address version {}, this provider reads {VERSION}",
                b[4]
            ));
        }
        let ep = u16::from_le_bytes([b[5], b[6]]);
        let n = usize::from(u16::from_le_bytes([b[7], b[8]]));
        if b.len() - FIXED != n {
            return Err(format!(
                "the address says {n} bytes of BTL address follow, {} do",
                b.len() - FIXED
            ));
        }
        let domain = Address::decode(&b[FIXED..])?;
        Ok(EpAddr { domain, ep })
    }

    /// The length of the address at the start of `b`, if the fixed part
    /// there is one of ours: how `fi_av_insert` steps through a packed
    /// array of addresses (each may have its own length).
    pub fn len_at(b: &[u8]) -> Option<usize> {
        if b.len() < FIXED || &b[..4] != MAGIC {
            return None;
        }
        Some(FIXED + usize::from(u16::from_le_bytes([b[7], b[8]])))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use xrcbtl_btl::Receive;

    fn sample() -> EpAddr {
        EpAddr {
            domain: Address {
                rank: 0x0102_0304,
                listen: "10.0.0.7:4791".parse::<SocketAddr>().unwrap(),
                node_key: "node7/rxe0".into(),
                receive: Receive::Rc,
                ib: None,
            },
            ep: 3,
        }
    }

    #[test]
    fn an_address_round_trips_and_says_its_length() {
        let a = sample();
        let b = a.encode().unwrap();
        assert!(b.len() <= MAX_LEN);
        assert_eq!(EpAddr::decode(&b).unwrap(), a);
        let mut two = b.clone();
        two.extend_from_slice(&b);
        assert_eq!(EpAddr::len_at(&two), Some(b.len()));
    }

    #[test]
    fn anything_else_is_refused_with_a_reason() {
        let b = sample().encode().unwrap();
        assert!(EpAddr::decode(&b[..5]).unwrap_err().contains("shorter"));
        let mut foreign = b.clone();
        foreign[0] = b'Y';
        assert!(EpAddr::decode(&foreign).unwrap_err().contains("magic"));
        assert_eq!(EpAddr::len_at(&foreign), None);
        let mut newer = b.clone();
        newer[4] = 2;
        assert!(EpAddr::decode(&newer).unwrap_err().contains("version 2"));
        assert!(EpAddr::decode(&b[..b.len() - 1])
            .unwrap_err()
            .contains("follow"));
        let mut longer = b.clone();
        longer.push(0);
        assert!(EpAddr::decode(&longer).unwrap_err().contains("follow"));
        // A BTL address that does not decode, with a consistent length.
        let mut bad_btl = b.clone();
        bad_btl[FIXED] = b'Q';
        assert!(EpAddr::decode(&bad_btl).unwrap_err().contains("magic"));
    }
}
