//! POSIX ACLs through FUSE. With FUSE_POSIX_ACL the kernel enforces ACLs (it reads them with
//! getxattr) but leaves to the filesystem what the kernel's own filesystems get from the VFS:
//! inheriting a directory's default ACL at creation (and then not applying the umask), keeping
//! the access ACL's owner, mask and other entries equal to the mode on chmod, and taking the
//! mode from an access ACL that is set. This module holds those rules over the xattr form of
//! ACLs (`system.posix_acl_*`: a version-2 header and 8-byte entries).

pub const ACCESS: &[u8] = b"system.posix_acl_access";
pub const DEFAULT: &[u8] = b"system.posix_acl_default";

const VERSION: u32 = 2;
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub tag: u16,
    pub perm: u16,
    pub id: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acl(pub Vec<Entry>);

impl Acl {
    /// Parses the xattr form; None when it is malformed.
    pub fn parse(b: &[u8]) -> Option<Acl> {
        if b.len() < 4 || !(b.len() - 4).is_multiple_of(8) {
            return None;
        }
        if u32::from_le_bytes(b[..4].try_into().ok()?) != VERSION {
            return None;
        }
        let entries = b[4..]
            .chunks(8)
            .map(|c| Entry {
                tag: u16::from_le_bytes([c[0], c[1]]),
                perm: u16::from_le_bytes([c[2], c[3]]) & 7,
                id: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
            })
            .collect();
        Some(Acl(entries))
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = VERSION.to_le_bytes().to_vec();
        for e in &self.0 {
            v.extend_from_slice(&e.tag.to_le_bytes());
            v.extend_from_slice(&e.perm.to_le_bytes());
            let id = if matches!(e.tag, USER | GROUP) {
                e.id
            } else {
                u32::MAX
            };
            v.extend_from_slice(&id.to_le_bytes());
        }
        v
    }

    /// Whether the ACL says no more than the mode bits (owner, group, other only).
    pub fn is_equivalent_to_mode(&self) -> bool {
        self.0
            .iter()
            .all(|e| matches!(e.tag, USER_OBJ | GROUP_OBJ | OTHER))
    }

    /// The permission bits (rwx for owner, group class, other) this ACL stands for: the
    /// group class is the mask entry when there is one.
    pub fn mode_bits(&self) -> u32 {
        let get = |t: u16| self.0.iter().find(|e| e.tag == t).map(|e| e.perm as u32);
        let user = get(USER_OBJ).unwrap_or(0);
        let group = get(MASK).or_else(|| get(GROUP_OBJ)).unwrap_or(0);
        let other = get(OTHER).unwrap_or(0);
        (user << 6) | (group << 3) | other
    }

    /// For a new inode under a default ACL: limits the ACL by the requested mode and the mode
    /// by the ACL (the kernel's posix_acl_create_masq). Returns the new mode.
    pub fn create_masq(&mut self, mode: u32) -> u32 {
        let mut mode = mode;
        let mut mask_at = None;
        let mut group_at = None;
        for (i, e) in self.0.iter_mut().enumerate() {
            match e.tag {
                USER_OBJ => {
                    e.perm &= ((mode >> 6) & 7) as u16;
                    mode &= ((e.perm as u32) << 6) | !0o700;
                }
                OTHER => {
                    e.perm &= (mode & 7) as u16;
                    mode &= (e.perm as u32) | !0o007;
                }
                GROUP_OBJ => group_at = Some(i),
                MASK => mask_at = Some(i),
                _ => {}
            }
        }
        if let Some(i) = mask_at.or(group_at) {
            let e = &mut self.0[i];
            e.perm &= ((mode >> 3) & 7) as u16;
            mode &= ((e.perm as u32) << 3) | !0o070;
        }
        mode
    }

    /// After chmod: owner, group class (mask, or the owning group without one) and other take
    /// the new mode's bits (the kernel's posix_acl_chmod).
    pub fn chmod(&mut self, mode: u32) {
        let has_mask = self.0.iter().any(|e| e.tag == MASK);
        for e in &mut self.0 {
            match e.tag {
                USER_OBJ => e.perm = ((mode >> 6) & 7) as u16,
                MASK => e.perm = ((mode >> 3) & 7) as u16,
                GROUP_OBJ if !has_mask => e.perm = ((mode >> 3) & 7) as u16,
                OTHER => e.perm = (mode & 7) as u16,
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(u16, u16, u32)]) -> Acl {
        Acl(entries
            .iter()
            .map(|&(tag, perm, id)| Entry { tag, perm, id })
            .collect())
    }

    #[test]
    fn bytes_round_trip_and_bad_input() {
        let a = acl(&[
            (USER_OBJ, 7, 0),
            (USER, 6, 1000),
            (GROUP_OBJ, 5, 0),
            (MASK, 6, 0),
            (OTHER, 4, 0),
        ]);
        let b = a.to_bytes();
        assert_eq!(b.len(), 4 + 5 * 8);
        let back = Acl::parse(&b).unwrap();
        assert_eq!(back.0[1].id, 1000);
        assert_eq!(
            back.0[0].id,
            u32::MAX,
            "ids of owner/mask/other entries are written as -1"
        );
        assert!(Acl::parse(&b[..7]).is_none());
        assert!(Acl::parse(&[1, 0, 0, 0]).is_none());
        assert_eq!(a.mode_bits(), 0o764);
        assert!(!a.is_equivalent_to_mode());
    }

    #[test]
    fn create_masq_as_the_kernel() {
        // default: u::rwx, u:1000:rwx, g::r-x, m::rwx, o::r-x ; open(0666)
        let mut a = acl(&[
            (USER_OBJ, 7, 0),
            (USER, 7, 1000),
            (GROUP_OBJ, 5, 0),
            (MASK, 7, 0),
            (OTHER, 5, 0),
        ]);
        let mode = a.create_masq(0o100666);
        assert_eq!(mode, 0o100664);
        assert_eq!(a.mode_bits(), 0o664);
        // Without a mask the owning group entry takes the group bits.
        let mut b = acl(&[(USER_OBJ, 7, 0), (GROUP_OBJ, 7, 0), (OTHER, 0, 0)]);
        assert_eq!(b.create_masq(0o40755), 0o40750);
        assert!(b.is_equivalent_to_mode());
    }

    #[test]
    fn chmod_updates_mask_not_group() {
        let mut a = acl(&[
            (USER_OBJ, 7, 0),
            (USER, 7, 1000),
            (GROUP_OBJ, 7, 0),
            (MASK, 7, 0),
            (OTHER, 7, 0),
        ]);
        a.chmod(0o640);
        assert_eq!(a.mode_bits(), 0o640);
        assert_eq!(
            a.0[2].perm, 7,
            "the owning group entry keeps its bits under a mask"
        );
    }
}
