//! How the tools that fill an image (`mkfs -d`, `cp` into an image, `cp --from-tar`) open it:
//! below mkfs, cp and tar, which all build, so that none of them imports another for it.

use anyhow::{anyhow, Result};
use uext4::blockdev::Region;
use uext4::MountOptions;

/// How the engine is opened to fill an image (mkfs -d, cp into an image, cp --from-tar): with
/// SOURCE_DATE_EPOCH clamping every time it records, and caches sized for a stream of new
/// entries that are not read again (with the commits of `cp::Batch`, memory stays the same
/// whatever the size of the tree). The image is written with pread/pwrite, not mapped: a
/// mapping's touched pages would count against the builder's memory.
pub(crate) fn options(region: Option<Region>) -> Result<MountOptions> {
    Ok(MountOptions {
        region,
        commit_interval_secs: 0,
        time_clamp: source_date_epoch()?,
        inode_cache_limit: 2048,
        cache_limit_bytes: 4 << 20,
        map_tmpfs: false,
        keys: crate::image::keys().to_vec(),
        ..Default::default()
    })
}

/// SOURCE_DATE_EPOCH, when set: seconds since the epoch.
pub(crate) fn source_date_epoch() -> Result<Option<i64>> {
    match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| anyhow!("SOURCE_DATE_EPOCH={v:?} is not a number of seconds")),
        _ => Ok(None),
    }
}
