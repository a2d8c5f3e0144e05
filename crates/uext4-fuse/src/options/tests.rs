use super::*;

#[test]
fn options_parse_and_reject() {
    let o = Options::parse(
        "ro,threads=4,allow_other,writeback_cache,commit=7,errors=continue,dax,delalloc",
    )
    .unwrap();
    assert!(o.read_only && o.allow_other && o.writeback_cache == Some(true) && o.dax && o.delalloc);
    assert_eq!((o.threads, o.commit_secs), (4, 7));
    assert!(o.map_tmpfs, "an image on tmpfs is mapped by default");
    let o = Options::parse("dax,nodax").unwrap();
    assert!(!o.dax && !o.map_tmpfs && !o.mount_options().map_tmpfs);
    let e = Options::parse("rw,bogus").unwrap_err();
    assert!(e.contains("bogus"), "{e}");
    assert!(Options::parse("threads=x").is_err());
    assert!(Options::parse("threads=0").is_err());
    assert!(Options::parse("allow_other=1").is_err());
    assert!(Options::parse("sync").is_err());
    let o = Options::parse("defaults,noatime,relatime,nodev,nosuid,noexec").unwrap();
    assert!(o.nodev && o.nosuid && o.noexec && !o.read_only);
    assert!(Options::parse("errors=explode").is_err());
    assert!(Options::default().threads >= 2);
    assert!(Options::default().mount_options().prealloc_zeroed);
    assert!(
        !Options::parse("prealloc=unwritten")
            .unwrap()
            .mount_options()
            .prealloc_zeroed
    );
    assert!(Options::parse("prealloc=zeroed").unwrap().prealloc_zeroed);
    assert!(Options::parse("prealloc").is_err());
    assert!(Options::default().mount_options().fast_commit);
    let o = Options::parse("nofast_commit").unwrap().mount_options();
    assert!(!o.fast_commit);
    assert!(
        Options::parse("nofast_commit,fast_commit")
            .unwrap()
            .fast_commit
    );
    assert!(Options::parse("fast_commit=off").is_err());
}

#[test]
fn atime_options() {
    use uext4::AtimeMode::*;
    let mode = |l: &str| Options::parse(l).unwrap().mount_options().atime.mode;
    assert_eq!(mode(""), Relative, "relatime by default, as mount(8)");
    assert_eq!(mode("noatime"), NoAtime);
    assert_eq!(mode("strictatime"), Strict);
    assert_eq!(mode("noatime,relatime"), Relative);
    assert_eq!(mode("noatime,atime"), Relative);
    assert_eq!(mode("strictatime,atime"), Strict);
    assert!(Options::parse("nodiratime").unwrap().atime.nodiratime);
    assert!(
        !Options::parse("nodiratime,diratime")
            .unwrap()
            .atime
            .nodiratime
    );
}

#[test]
fn transport_option() {
    assert_eq!(Options::default().transport, TransportKind::Auto);
    assert_eq!(
        Options::parse("transport=uring").unwrap().transport,
        TransportKind::Uring
    );
    assert_eq!(
        Options::parse("transport=dev").unwrap().transport,
        TransportKind::Dev
    );
    assert_eq!(
        Options::parse("transport=auto").unwrap().transport,
        TransportKind::Auto
    );
    assert!(Options::parse("transport=pipe").is_err());
    assert!(Options::parse("transport").is_err());
}

#[test]
fn timeouts_and_noopen() {
    use std::time::Duration;
    let o = Options::parse("").unwrap();
    assert_eq!(
        (o.entry_timeout, o.attr_timeout()),
        (LONG_TIMEOUT, LONG_TIMEOUT)
    );
    assert_eq!(
        Options::parse("delalloc").unwrap().attr_timeout(),
        Duration::from_secs(1)
    );
    let o = Options::parse("entry_timeout=0.5,attr_timeout=0,delalloc").unwrap();
    assert_eq!(
        (o.entry_timeout, o.attr_timeout()),
        (Duration::from_millis(500), Duration::ZERO)
    );
    for bad in [
        "entry_timeout",
        "entry_timeout=-1",
        "attr_timeout=x",
        "attr_timeout=inf",
    ] {
        assert!(Options::parse(bad).is_err(), "{bad}");
    }
    assert!(Options::parse("noopen=1").is_err());
    assert!(Options::parse("noopen").unwrap_err().contains("noatime"));
    assert!(Options::parse("noopen,strictatime").is_err());
    assert!(Options::parse("noatime,noopen").unwrap().noopen);
    assert!(Options::parse("ro,noopen").unwrap().noopen);
    assert!(Options::parse("noatime,noopen,writeback_cache").is_err());
    assert!(Options::parse("noatime,noopen,direct_io").is_err());
}

#[test]
fn quota_limit_options() {
    let limits = |s: &str| Options::parse(s).unwrap().mount_options().quota_limits;
    assert_eq!(limits(""), [false; 3]);
    assert_eq!(limits("usrquota"), [true, false, false]);
    assert_eq!(limits("quota,prjquota"), [true, false, true]);
    assert_eq!(limits("grpquota"), [false, true, false]);
    assert_eq!(limits("usrquota,grpquota,prjquota,noquota"), [false; 3]);
}
