//! The ACL/mode rules on their own (uext4::acl), as the kernel's fs/posix_acl.c.

use uext4::acl;
use uext4::format::xattr::{AclEntry, ACL_GROUP_OBJ, ACL_MASK, ACL_OTHER, ACL_USER, ACL_USER_OBJ};

fn acl(entries: &[(u16, u16, u32)]) -> Vec<AclEntry> {
    entries
        .iter()
        .map(|&(tag, perm, id)| AclEntry { tag, perm, id })
        .collect()
}

#[test]
fn create_masq_limits_mode_and_acl_as_the_kernel() {
    // default: u::rwx, u:1000:rwx, g::r-x, m::rwx, o::r-x ; open(0666)
    let mut a = acl(&[
        (ACL_USER_OBJ, 7, 0),
        (ACL_USER, 7, 1000),
        (ACL_GROUP_OBJ, 5, 0),
        (ACL_MASK, 7, 0),
        (ACL_OTHER, 5, 0),
    ]);
    assert_eq!(acl::create_masq(&mut a, 0o100666), 0o100664);
    assert_eq!(acl::mode_bits(&a), 0o664);
    assert!(!acl::is_equivalent_to_mode(&a));
    // Without a mask the owning group entry takes the group bits.
    let mut b = acl(&[
        (ACL_USER_OBJ, 7, 0),
        (ACL_GROUP_OBJ, 7, 0),
        (ACL_OTHER, 0, 0),
    ]);
    assert_eq!(acl::create_masq(&mut b, 0o40755), 0o40750);
    assert!(acl::is_equivalent_to_mode(&b));
}

#[test]
fn chmod_updates_the_mask_not_the_owning_group() {
    let mut a = acl(&[
        (ACL_USER_OBJ, 7, 0),
        (ACL_USER, 7, 1000),
        (ACL_GROUP_OBJ, 7, 0),
        (ACL_MASK, 7, 0),
        (ACL_OTHER, 7, 0),
    ]);
    acl::chmod(&mut a, 0o640);
    assert_eq!(acl::mode_bits(&a), 0o640);
    assert_eq!(
        a[2].perm, 7,
        "the owning group entry keeps its bits under a mask"
    );
}
