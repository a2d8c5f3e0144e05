use super::*;

#[test]
fn root_is_one_to_fuse_and_two_to_ext4() {
    assert_eq!(to_ext(1), 2);
    assert_eq!(to_fuse(2), 1);
    assert_eq!(to_ext(to_fuse(12)), 12);
}

#[test]
fn times_before_1970_go_over_as_the_kernel_sent_them() {
    // -1.75 s is (-2 s, 250000000 ns) on the wire, and stays so.
    let t = timestamp((-2, 250_000_000));
    assert_eq!(
        t,
        Timestamp {
            sec: -2,
            nsec: 250_000_000
        }
    );
    assert_eq!(wire_time(t), (-2, 250_000_000));
}

#[test]
fn unknown_file_types_show_as_regular_files() {
    assert_eq!(file_type(0o040755), 0o040000);
    assert_eq!(file_type(0o170644), 0o100000);
    assert_eq!(type_of_ft(2), 0o040000);
    assert_eq!(type_of_ft(0), 0o100000);
}
