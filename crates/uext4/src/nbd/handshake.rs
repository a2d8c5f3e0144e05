//! The fixed newstyle handshake (NBD_OPT_GO, with the old NBD_OPT_EXPORT_NAME as a fallback)
//! that opens each connection, ending in the transmission phase.

use super::*;

fn send_option(s: &mut Stream, opt: u32, data: &[u8]) -> io::Result<()> {
    let mut m = Vec::with_capacity(16 + data.len());
    m.extend_from_slice(&IHAVEOPT.to_be_bytes());
    m.extend_from_slice(&opt.to_be_bytes());
    m.extend_from_slice(&(data.len() as u32).to_be_bytes());
    m.extend_from_slice(data);
    s.write_all(&m)
}

/// The fixed newstyle handshake on a fresh connection, ending in the transmission phase.
pub(super) fn handshake(s: &mut Stream, export: &str) -> Result<ExportInfo> {
    let proto = Error::Nbd;
    let io_err = handshake_io_err;
    let no_zeroes = greet(s)?;

    // NBD_OPT_GO: the export name, and one information request (block sizes), which also
    // tells the server that this client honours block size constraints.
    let mut go = Vec::with_capacity(8 + export.len());
    go.extend_from_slice(&(export.len() as u32).to_be_bytes());
    go.extend_from_slice(export.as_bytes());
    go.extend_from_slice(&1u16.to_be_bytes());
    go.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    send_option(s, OPT_GO, &go).map_err(io_err)?;
    let mut export_info: Option<(u64, u16)> = None;
    let mut sizes: Option<(u32, u32, u32)> = None;
    let shown = if export.is_empty() {
        "the default export".to_string()
    } else {
        format!("export {export:?}")
    };
    loop {
        if read_u64(s).map_err(io_err)? != OPT_REPLY_MAGIC {
            return Err(proto("bad option reply magic".into()));
        }
        let opt = read_u32(s).map_err(io_err)?;
        let rtype = read_u32(s).map_err(io_err)?;
        let len = read_u32(s).map_err(io_err)?;
        if opt != OPT_GO {
            return Err(proto(format!(
                "the server answered option {opt} to NBD_OPT_GO"
            )));
        }
        if len > MAX_OPTION_REPLY {
            return Err(proto(format!("an option reply of {len} bytes")));
        }
        let mut data = vec![0u8; len as usize];
        s.read_exact(&mut data).map_err(io_err)?;
        let msg = || {
            let m = String::from_utf8_lossy(&data).trim().to_string();
            if m.is_empty() {
                String::new()
            } else {
                format!(" ({m})")
            }
        };
        match rtype {
            REP_ACK => break,
            REP_INFO => read_info(&data, &mut export_info, &mut sizes)?,
            REP_ERR_UNSUP => {
                // A server from before NBD_OPT_GO.
                return export_name_fallback(s, export, no_zeroes);
            }
            REP_ERR_UNKNOWN => {
                return Err(Error::Nbd(format!("the server has no {shown}{}", msg())))
            }
            REP_ERR_TLS_REQD => {
                return Err(Error::NotSupported(format!(
                    "the server requires TLS, which uext4's NBD client does not support{}",
                    msg()
                )))
            }
            REP_ERR_POLICY => {
                return Err(Error::Nbd(format!(
                    "the server refuses {shown} by its policy{}",
                    msg()
                )))
            }
            REP_ERR_SHUTDOWN => {
                return Err(Error::Nbd(format!("the server is shutting down{}", msg())))
            }
            REP_ERR_INVALID | REP_ERR_PLATFORM | REP_ERR_BLOCK_SIZE_REQD | REP_ERR_TOO_BIG => {
                return Err(Error::Nbd(format!(
                    "the server refused NBD_OPT_GO (error {:#x}){}",
                    rtype,
                    msg()
                )))
            }
            t if t & REP_ERR != 0 => {
                return Err(Error::Nbd(format!(
                    "the server refused NBD_OPT_GO (error {t:#x}){}",
                    msg()
                )))
            }
            _ => {} // unknown non-error replies are ignored, as the protocol asks
        }
    }
    let (size, flags) =
        export_info.ok_or_else(|| proto("NBD_OPT_GO ended without NBD_INFO_EXPORT".into()))?;
    let info = block_sizes(size, flags, sizes)?;
    s.set_read_timeout(None).map_err(io_err)?;
    Ok(info)
}

/// What an I/O error during the handshake means to the user.
fn handshake_io_err(e: io::Error) -> Error {
    let proto = Error::Nbd;
    match e.kind() {
        io::ErrorKind::UnexpectedEof => proto(
            "the server closed the connection during the handshake (is the export name right? \
             does the server take more clients?)"
                .into(),
        ),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => proto(format!(
            "the server did not answer the handshake within {} s",
            HANDSHAKE_TIMEOUT.as_secs()
        )),
        _ => proto(format!("handshake: {e}")),
    }
}

/// The server's greeting (fixed newstyle only) and the client's flags; whether the server
/// leaves out the zeroes after an old-style export reply.
fn greet(s: &mut Stream) -> Result<bool> {
    let proto = Error::Nbd;
    let io_err = handshake_io_err;
    s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(io_err)?;
    if read_u64(s).map_err(io_err)? != NBDMAGIC {
        return Err(proto("not an NBD server (no NBDMAGIC greeting)".into()));
    }
    match read_u64(s).map_err(io_err)? {
        IHAVEOPT => {}
        CLISERV_MAGIC => {
            return Err(proto(
                "the server speaks the old-style handshake; only fixed newstyle is supported"
                    .into(),
            ))
        }
        m => return Err(proto(format!("unknown handshake magic {m:#x}"))),
    }
    let hflags = read_u16(s).map_err(io_err)?;
    if hflags & FLAG_FIXED_NEWSTYLE == 0 {
        return Err(proto(
            "the server does not speak the fixed newstyle handshake".into(),
        ));
    }
    let no_zeroes = hflags & FLAG_NO_ZEROES != 0;
    let cflags = FLAG_C_FIXED_NEWSTYLE | if no_zeroes { FLAG_C_NO_ZEROES } else { 0 };
    s.write_all(&cflags.to_be_bytes()).map_err(io_err)?;
    Ok(no_zeroes)
}

/// One NBD_REP_INFO reply to NBD_OPT_GO: the export's size and flags, or its block sizes.
fn read_info(
    data: &[u8],
    export_info: &mut Option<(u64, u16)>,
    sizes: &mut Option<(u32, u32, u32)>,
) -> Result<()> {
    let proto = Error::Nbd;
    if data.len() < 2 {
        return Err(proto("an NBD_REP_INFO reply too short".into()));
    }
    let kind = u16::from_be_bytes([data[0], data[1]]);
    let body = &data[2..];
    match kind {
        INFO_EXPORT => {
            if body.len() != 10 {
                return Err(proto("an NBD_INFO_EXPORT of the wrong length".into()));
            }
            let size = u64::from_be_bytes(body[0..8].try_into().unwrap_or_default());
            let flags = u16::from_be_bytes([body[8], body[9]]);
            *export_info = Some((size, flags));
        }
        INFO_BLOCK_SIZE => {
            if body.len() != 12 {
                return Err(proto("an NBD_INFO_BLOCK_SIZE of the wrong length".into()));
            }
            let g = |i: usize| u32::from_be_bytes(body[i..i + 4].try_into().unwrap_or_default());
            *sizes = Some((g(0), g(4), g(8)));
        }
        _ => {} // names, descriptions: not needed
    }
    Ok(())
}

/// Ends a handshake that failed with `NBD_OPT_ABORT`, as the protocol asks (best effort: the
/// server may be gone already).
pub(super) fn abort(s: &mut Stream) {
    let _ = s.set_read_timeout(Some(Duration::from_millis(1)));
    let _ = send_option(s, OPT_ABORT, &[]);
    s.shutdown();
}

/// `NBD_OPT_EXPORT_NAME`, for a server without `NBD_OPT_GO`: no block size constraints.
fn export_name_fallback(s: &mut Stream, export: &str, no_zeroes: bool) -> Result<ExportInfo> {
    let io_err = |e: io::Error| {
        Error::Nbd(if e.kind() == io::ErrorKind::UnexpectedEof {
            format!("the server closed the connection: it has no export {export:?}")
        } else {
            format!("handshake: {e}")
        })
    };
    send_option(s, OPT_EXPORT_NAME, export.as_bytes()).map_err(io_err)?;
    let size = read_u64(s).map_err(io_err)?;
    let flags = read_u16(s).map_err(io_err)?;
    if !no_zeroes {
        let mut z = [0u8; 124];
        s.read_exact(&mut z).map_err(io_err)?;
    }
    let info = block_sizes(size, flags, None)?;
    s.set_read_timeout(None).map_err(io_err)?;
    Ok(info)
}

/// Checks the export's size, flags and block size constraints (the protocol's defaults where
/// the server gave none).
pub(super) fn block_sizes(
    size: u64,
    flags: u16,
    sizes: Option<(u32, u32, u32)>,
) -> Result<ExportInfo> {
    let proto = Error::Nbd;
    if flags & TF_HAS_FLAGS == 0 {
        return Err(proto(
            "the server sent transmission flags without HAS_FLAGS".into(),
        ));
    }
    if size > i64::MAX as u64 {
        return Err(proto(format!("an export size of {size} bytes")));
    }
    let (min, _pref, max) = sizes.unwrap_or((1, 4096, DEFAULT_MAX_PAYLOAD));
    if !min.is_power_of_two() || min > 64 * 1024 {
        return Err(proto(format!("a minimum block size of {min}")));
    }
    let max = max.min(DEFAULT_MAX_PAYLOAD);
    if max < min {
        return Err(proto(format!(
            "a maximum block size of {max} below the minimum {min}"
        )));
    }
    // Whole minimum blocks per request.
    let max_payload = max / min * min;
    Ok(ExportInfo {
        size,
        flags,
        min_block: min,
        max_payload,
    })
}
