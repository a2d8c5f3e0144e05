use super::handshake::block_sizes;
use super::*;

fn tcp(host: &str, port: u16, export: &str) -> NbdUri {
    NbdUri {
        address: Address::Tcp {
            host: host.into(),
            port,
        },
        export: export.into(),
        connections: None,
    }
}

#[test]
fn uris_parse_as_the_standard_says() {
    let p = |s| NbdUri::parse(s).unwrap();
    assert_eq!(
        p("nbd://example.com/disk"),
        tcp("example.com", 10809, "disk")
    );
    assert_eq!(p("nbd://example.com/"), tcp("example.com", 10809, ""));
    assert_eq!(p("nbd://example.com"), tcp("example.com", 10809, ""));
    assert_eq!(
        p("nbd://example.com//disk"),
        tcp("example.com", 10809, "/disk")
    );
    assert_eq!(
        p("nbd://example.com/hello%20world"),
        tcp("example.com", 10809, "hello world")
    );
    assert_eq!(p("nbd://127.0.0.1:1234/x"), tcp("127.0.0.1", 1234, "x"));
    assert_eq!(p("nbd://[::1]:1234/x"), tcp("::1", 1234, "x"));
    assert_eq!(p("nbd://[::1]/x"), tcp("::1", 10809, "x"));
    assert_eq!(p("nbd:///x"), tcp("localhost", 10809, "x"));
    assert_eq!(
        p("NBD+UNIX:///disk?socket=/run/x.sock"),
        NbdUri {
            address: Address::Unix("/run/x.sock".into()),
            export: "disk".into(),
            connections: None,
        }
    );
    assert_eq!(
        p("nbd+unix:///?socket=%00abs&x-connections=2"),
        NbdUri {
            address: Address::UnixAbstract(b"abs".to_vec()),
            export: "".into(),
            connections: Some(2),
        }
    );
}

#[test]
fn bad_uris_are_one_line_errors() {
    let e = |s| NbdUri::parse(s).unwrap_err().to_string();
    assert!(e("nbds://h/x").contains("TLS"));
    assert!(e("nbds+unix:///x?socket=/s").contains("TLS"));
    assert!(e("nbd://h/x?tls-type=anon").contains("TLS"));
    assert!(e("nbd+vsock://1/x").contains("not supported"));
    assert!(e("nbd+unix:///x").contains("socket="));
    assert!(e("nbd+unix://host/x?socket=/s").contains("no host"));
    assert!(e("nbd://h:99999/x").contains("bad port"));
    assert!(e("nbd://h:0/x").contains("bad port"));
    assert!(e("nbd://h/x?foo=1").contains("unknown query parameter"));
    assert!(e("nbd://h/%zz").contains("hex"));
    assert!(e("nbd://h/x?x-connections=0").contains("x-connections"));
    assert!(e("nbd://[::1/x").contains("']'"));
    assert!(e("nbd://u@h/x").contains("TLS"));
}

#[test]
fn block_size_constraints_are_checked() {
    let ok = block_sizes(1 << 20, TF_HAS_FLAGS, Some((512, 4096, 1 << 30))).unwrap();
    assert_eq!((ok.min_block, ok.max_payload), (512, DEFAULT_MAX_PAYLOAD));
    let odd = block_sizes(1 << 20, TF_HAS_FLAGS, Some((4096, 4096, 10000))).unwrap();
    assert_eq!(odd.max_payload, 8192);
    assert!(block_sizes(1, TF_HAS_FLAGS, Some((3, 4096, 8192))).is_err());
    assert!(block_sizes(1, TF_HAS_FLAGS, Some((4096, 4096, 512))).is_err());
    assert!(block_sizes(1, 0, None).is_err());
    assert!(block_sizes(u64::MAX, TF_HAS_FLAGS, None).is_err());
}
