use super::layout::backup_groups;
use super::*;
use crate::format::csum::crc32c;
use crate::format::superblock::sparse_group;
use crate::format::superblock::{Superblock, EXT4_MAGIC};

#[test]
fn backup_groups_in_list_order() {
    assert_eq!(backup_groups(75, true), vec![1, 3, 5, 7, 9, 25, 27, 49]);
    assert_eq!(backup_groups(1, true), Vec::<u32>::new());
    assert_eq!(backup_groups(4, false), vec![1, 2, 3]);
    assert!(sparse_group(243) && sparse_group(343) && !sparse_group(16));
}

#[test]
fn layout_matches_mke2fs() {
    // mke2fs -t ext4 -b 1024 on 600 MiB: 614400 blocks, 75 groups, 512 inodes per group,
    // 128 inode table blocks, 5 descriptor blocks, 256 reserved GDT blocks, 30720 reserved.
    let mut o = MkfsOptions::default_for(600 << 20);
    o.block_size = 1024;
    let g = layout(600 << 20, &o).unwrap();
    assert_eq!(
        (g.blocks, g.groups, g.inodes_per_group, g.inode_table_blocks),
        (614400, 75, 512, 128)
    );
    assert_eq!(
        (g.desc_blocks, g.reserved_gdt_blocks, g.r_blocks),
        (5, 256, 30720)
    );
    // Too small.
    assert!(layout(32 << 10, &MkfsOptions::default_for(32 << 10)).is_err());
    // Bad options.
    let mut o = MkfsOptions::default_for(64 << 20);
    o.block_size = 512;
    assert!(layout(64 << 20, &o).is_err());
    o.block_size = 4096;
    o.inode_size = 100;
    assert!(layout(64 << 20, &o).is_err());
}

#[test]
fn feature_lists() {
    let mut f = FeatureSet::ext4();
    f.apply("^metadata_csum,^resize_inode,orphan_file").unwrap();
    assert!(!f.metadata_csum && !f.resize_inode && f.orphan_file && f.uninit_bg);
    assert!(f.clone().apply("^extent").is_err(), "64bit needs extents");
    assert!(f.clone().apply("^extent,^64bit").is_ok());
    assert!(
        f.clone().apply("bigalloc").is_ok(),
        "bigalloc with orphan_file, as mke2fs makes it"
    );
    assert!(FeatureSet::ext4().apply("bigalloc").is_ok());
    assert!(
        FeatureSet::ext3().apply("bigalloc").is_err(),
        "bigalloc needs extents"
    );
    // The presets are mke2fs.conf's: ext3 is ext4 less its own features, ext2 that less
    // the journal.
    let mut ext3 = FeatureSet::ext4();
    ext3.apply(
        "^extent,^64bit,^flex_bg,^huge_file,^dir_nlink,^extra_isize,^metadata_csum,^uninit_bg",
    )
    .unwrap();
    assert_eq!(FeatureSet::for_type("ext3").unwrap(), ext3);
    assert_eq!(ext3.type_name(), "ext3");
    ext3.apply("^has_journal").unwrap();
    assert_eq!(FeatureSet::for_type("ext2").unwrap(), ext3);
    assert_eq!(ext3.type_name(), "ext2");
    assert_eq!(FeatureSet::for_type("ext4").unwrap().type_name(), "ext4");
    assert!(FeatureSet::for_type("xfs").is_err());
    assert!(FeatureSet::ext4()
        .apply("^has_journal,orphan_file")
        .is_err());
}

#[test]
fn journal_superblock_checksum() {
    let j = journal_superblock(4096, 1024, [7; 16], true, true, 0);
    assert_eq!(&j[0..4], &[0xC0, 0x3B, 0x39, 0x98]);
    let mut z = j.clone();
    z[0xFC..0x100].fill(0);
    assert_eq!(
        u32::from_be_bytes(j[0xFC..0x100].try_into().unwrap()),
        crc32c(!0, &z)
    );
    let p = crate::journal::format::JournalSuperblock::parse(&j).unwrap();
    assert_eq!(
        (p.block_size, p.maxlen, p.first, p.sequence, p.start),
        (4096, 1024, 1, 1, 0)
    );
    assert_eq!(
        (p.feature_incompat, p.checksum_type, p.nr_users),
        (0x12, 4, 1)
    );
    assert_eq!((p.uuid, &j[0x100..0x110]), ([7; 16], &[7u8; 16][..]));
    let plain = journal_superblock(1024, 2048, [9; 16], false, false, 0);
    let p = crate::journal::format::JournalSuperblock::parse(&plain).unwrap();
    assert_eq!((p.feature_incompat, p.checksum_type), (0, 0));
}

#[test]
fn memdevice_layout_is_consistent() {
    let dev = crate::blockdev::MemDevice::new(16 << 20);
    let mut o = MkfsOptions::default_for(0);
    o.block_size = 1024;
    o.uuid = Some([1; 16]);
    mkfs(&dev, &o).unwrap();
    let img = dev.to_vec();
    let sb = Superblock::from_bytes(&img[1024..2048]);
    assert_eq!(sb.magic(), EXT4_MAGIC);
    assert!(sb.verify_csum());
    assert_eq!(sb.blocks_count(), 16384);
    // As mke2fs: room for 1024 times the size.
    assert_eq!(sb.reserved_gdt_blocks(), 127);
    assert_eq!(sb.inodes_count(), 1024);
}
