use super::*;
use crate::transport::InHeader;

fn req<'a>(opcode: u32, fixed: &'a [u8], rest: &'a [u8]) -> RawRequest<'a> {
    RawRequest {
        header: InHeader {
            opcode,
            nodeid: 1,
            ..InHeader::default()
        },
        fixed,
        rest,
    }
}

fn le(parts: &[u64]) -> Vec<u8> {
    parts.iter().flat_map(|p| p.to_ne_bytes()).collect()
}

#[test]
fn names_are_cut_at_their_nul() {
    let r = req(abi::LOOKUP, &[], b"file\0");
    assert_eq!(Op::decode(&r), Ok(Op::Lookup { name: b"file" }));
    let r = req(abi::SYMLINK, &[], b"link\0/target\0");
    assert_eq!(
        Op::decode(&r),
        Ok(Op::Symlink {
            name: b"link",
            target: b"/target"
        })
    );
    // No NUL: refused, never read past the end.
    assert_eq!(
        Op::decode(&req(abi::UNLINK, &[], b"abc")),
        Err(libc::EINVAL)
    );
}

#[test]
fn rename2_carries_its_flags_and_rename_none() {
    let mut f = le(&[7]);
    f.extend_from_slice(&(libc::RENAME_EXCHANGE).to_ne_bytes());
    f.extend_from_slice(&[0; 4]);
    let r = req(abi::RENAME2, &f, b"a\0b\0");
    assert_eq!(
        Op::decode(&r),
        Ok(Op::Rename {
            newdir: 7,
            flags: libc::RENAME_EXCHANGE,
            name: b"a",
            newname: b"b"
        })
    );
    let r = req(abi::RENAME, &f[..8], b"a\0b\0");
    assert!(matches!(Op::decode(&r), Ok(Op::Rename { flags: 0, .. })));
}

#[test]
fn write_data_is_the_size_the_struct_names_and_a_ring_fixed_area_may_be_longer() {
    // fh, offset, size | write_flags, lock_owner, flags | padding, then ring slack.
    let mut f = le(&[0, 4096, 3 | (abi::FUSE_WRITE_CACHE as u64) << 32, 0, 0]);
    f.resize(128, 0);
    let r = req(abi::WRITE, &f, b"abcdef");
    assert_eq!(
        Op::decode(&r),
        Ok(Op::Write {
            offset: 4096,
            write_flags: abi::FUSE_WRITE_CACHE,
            data: b"abc"
        })
    );
    // Shorter data than the struct says: refused.
    let f = le(&[0, 0, 10, 0, 0]);
    assert_eq!(Op::decode(&req(abi::WRITE, &f, b"abc")), Err(libc::EINVAL));
    // A fixed struct shorter than the opcode's: refused.
    assert_eq!(
        Op::decode(&req(abi::READ, &f[..16], b"")),
        Err(libc::EINVAL)
    );
}

#[test]
fn setattr_reads_only_what_valid_names_and_times_before_1970_as_sent() {
    let mut f = vec![0u8; 88];
    let valid = abi::FATTR_MODE | abi::FATTR_MTIME | abi::FATTR_ATIME | abi::FATTR_ATIME_NOW;
    f[0..4].copy_from_slice(&valid.to_ne_bytes());
    f[16..24].copy_from_slice(&99u64.to_ne_bytes()); // size, not named in valid
    f[40..48].copy_from_slice(&(-2i64).to_ne_bytes());
    f[60..64].copy_from_slice(&250_000_000u32.to_ne_bytes());
    f[68..72].copy_from_slice(&0o100644u32.to_ne_bytes());
    let Ok(Op::Setattr(s)) = Op::decode(&req(abi::SETATTR, &f, &[])) else {
        panic!("not a setattr");
    };
    assert_eq!(s.mode, Some(0o100644));
    assert_eq!(s.size, None);
    assert_eq!(s.atime, Some(TimeArg::Now));
    assert_eq!(s.mtime, Some(TimeArg::At(-2, 250_000_000)));
    assert!(!s.kill_suidgid);
}

#[test]
fn batch_forget_lists_its_entries() {
    let f = le(&[2]);
    let rest = le(&[5, 1, 9, 3]);
    let Ok(Op::BatchForget { entries }) = Op::decode(&req(abi::BATCH_FORGET, &f, &rest)) else {
        panic!("not a batch forget");
    };
    assert_eq!(forgets(entries).collect::<Vec<_>>(), vec![(5, 1), (9, 3)]);
    let f = le(&[3]);
    assert_eq!(
        Op::decode(&req(abi::BATCH_FORGET, &f, &rest)),
        Err(libc::EINVAL)
    );
}

#[test]
fn extensions_after_the_arguments_are_not_part_of_a_name() {
    let mut r = req(abi::LOOKUP, &[], b"x\0\0\0\0\0\0\0\0\0");
    r.header.total_extlen = 1;
    assert_eq!(Op::decode(&r), Ok(Op::Lookup { name: b"x" }));
}

#[test]
fn statx_tmpfile_syncfs_and_unknown_opcodes() {
    let mut f = vec![0u8; 24];
    f[20..24].copy_from_slice(&abi::STATX_BTIME.to_ne_bytes());
    assert!(matches!(
        Op::decode(&req(abi::STATX, &f, &[])),
        Ok(Op::Statx {
            sx_mask: abi::STATX_BTIME,
            ..
        })
    ));
    let mut f = vec![0u8; 16];
    f[4..8].copy_from_slice(&0o100600u32.to_ne_bytes());
    assert!(matches!(
        Op::decode(&req(abi::TMPFILE, &f, b"/\0")),
        Ok(Op::Tmpfile { mode: 0o100600, .. })
    ));
    assert_eq!(Op::decode(&req(abi::SYNCFS, &[0; 8], &[])), Ok(Op::Syncfs));
    assert_eq!(
        Op::decode(&req(abi::GETLK, &[0; 48], &[])),
        Ok(Op::Unknown(abi::GETLK))
    );
}

#[test]
fn ioctl_carries_its_input() {
    // fh, flags | cmd, arg, in_size | out_size
    let mut f = le(&[0, 0x8008_6602u64 << 32, 0]);
    f.extend_from_slice(&4u32.to_ne_bytes());
    f.extend_from_slice(&0u32.to_ne_bytes());
    let r = req(abi::IOCTL, &f, &[1, 2, 3, 4]);
    assert_eq!(
        Op::decode(&r),
        Ok(Op::Ioctl {
            cmd: 0x8008_6602,
            flags: 0,
            out_size: 0,
            data: &[1, 2, 3, 4]
        })
    );
}
