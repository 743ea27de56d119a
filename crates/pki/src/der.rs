//! A deliberately tiny DER reader for X.509 `Name`s.
//!
//! rustls-webpki hands out the raw DER of a certificate's subject but does not
//! decode it. We need two things from it: the common name (the train id of a
//! train certificate) and the full attribute list of the CA subject (to issue
//! leaves whose issuer name matches it byte for byte). From the CA
//! certificate we also need its subjectKeyIdentifier, so that the
//! authorityKeyIdentifier of every leaf matches it. Pulling in a full X.509
//! parser for that would cost more build time than these ~100 lines.

/// One `AttributeTypeAndValue` of a `Name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Attribute<'a> {
    /// The attribute type as OID arcs, e.g. `[2, 5, 4, 3]` for commonName.
    pub oid: Vec<u64>,
    /// The ASN.1 tag of the value (e.g. 0x0c UTF8String, 0x13 PrintableString).
    pub tag: u8,
    /// The raw value bytes.
    pub value: &'a [u8],
}

/// OID of the X.520 commonName attribute.
pub(crate) const COMMON_NAME: &[u64] = &[2, 5, 4, 3];

const TAG_SEQUENCE: u8 = 0x30;
const TAG_SET: u8 = 0x31;
const TAG_OID: u8 = 0x06;
const TAG_INTEGER: u8 = 0x02;

/// Reads one TLV from the front of `input`, returning (tag, value, rest).
fn read_tlv(input: &[u8]) -> Result<(u8, &[u8], &[u8]), &'static str> {
    let (&tag, rest) = input.split_first().ok_or("truncated DER: missing tag")?;
    if tag & 0x1f == 0x1f {
        return Err("unsupported DER high-tag-number form");
    }
    let (&first, mut rest) = rest.split_first().ok_or("truncated DER: missing length")?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 {
            return Err("unsupported DER length encoding");
        }
        if rest.len() < n {
            return Err("truncated DER length");
        }
        let (len_bytes, after) = rest.split_at(n);
        rest = after;
        len_bytes.iter().fold(0usize, |acc, &b| (acc << 8) | usize::from(b))
    };
    if rest.len() < len {
        return Err("truncated DER value");
    }
    let (value, rest) = rest.split_at(len);
    Ok((tag, value, rest))
}

/// Decodes the content octets of an OBJECT IDENTIFIER.
fn decode_oid(bytes: &[u8]) -> Result<Vec<u64>, &'static str> {
    if bytes.is_empty() {
        return Err("empty OID");
    }
    let mut arcs = Vec::new();
    let mut acc: u64 = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if acc > (u64::MAX >> 7) {
            return Err("OID arc too large");
        }
        acc = (acc << 7) | u64::from(b & 0x7f);
        if b & 0x80 == 0 {
            if arcs.is_empty() {
                // The first subidentifier packs the first two arcs.
                let (a, b) = match acc {
                    0..=39 => (0, acc),
                    40..=79 => (1, acc - 40),
                    _ => (2, acc - 80),
                };
                arcs.push(a);
                arcs.push(b);
            } else {
                arcs.push(acc);
            }
            acc = 0;
        } else if i == bytes.len() - 1 {
            return Err("truncated OID");
        }
    }
    Ok(arcs)
}

/// Parses the *contents* of a DER `Name` (the `RDNSequence` without its outer
/// SEQUENCE header, which is what `webpki::Cert::subject()` returns).
///
/// Only single-valued RDNs are supported; that is all `rcgen` (and nearly
/// every CA) produces.
pub(crate) fn parse_name(mut input: &[u8]) -> Result<Vec<Attribute<'_>>, &'static str> {
    let mut attributes = Vec::new();
    while !input.is_empty() {
        let (tag, rdn, rest) = read_tlv(input)?;
        input = rest;
        if tag != TAG_SET {
            return Err("RelativeDistinguishedName is not a SET");
        }
        let (tag, atv, rest) = read_tlv(rdn)?;
        if !rest.is_empty() {
            return Err("multi-valued RelativeDistinguishedName is not supported");
        }
        if tag != TAG_SEQUENCE {
            return Err("AttributeTypeAndValue is not a SEQUENCE");
        }
        let (tag, oid, rest) = read_tlv(atv)?;
        if tag != TAG_OID {
            return Err("attribute type is not an OBJECT IDENTIFIER");
        }
        let (value_tag, value, rest) = read_tlv(rest)?;
        if !rest.is_empty() {
            return Err("trailing data in AttributeTypeAndValue");
        }
        attributes.push(Attribute { oid: decode_oid(oid)?, tag: value_tag, value });
    }
    Ok(attributes)
}

/// Returns the decoded string of a directory string value, if its type is one
/// that can carry a train id (UTF8String, PrintableString or IA5String).
pub(crate) fn directory_string<'a>(attr: &Attribute<'a>) -> Option<&'a str> {
    match attr.tag {
        0x0c | 0x13 | 0x16 => std::str::from_utf8(attr.value).ok(),
        _ => None,
    }
}

const TAG_OCTET_STRING: u8 = 0x04;
const TAG_BOOLEAN: u8 = 0x01;
const TAG_EXTENSIONS: u8 = 0xa3;

/// OID of the subjectKeyIdentifier extension.
pub(crate) const SUBJECT_KEY_IDENTIFIER: &[u64] = &[2, 5, 29, 14];
/// OID of the authorityKeyIdentifier extension.
#[cfg(test)]
pub(crate) const AUTHORITY_KEY_IDENTIFIER: &[u64] = &[2, 5, 29, 35];

/// Returns the `extnValue` content (the DER inside the OCTET STRING) of the
/// extension `oid` of the certificate `cert_der`, if present.
pub(crate) fn extension_value<'a>(cert_der: &'a [u8], oid: &[u64]) -> Result<Option<&'a [u8]>, &'static str> {
    let (tag, cert, _) = read_tlv(cert_der)?;
    if tag != TAG_SEQUENCE {
        return Err("certificate is not a SEQUENCE");
    }
    let (tag, mut tbs, _) = read_tlv(cert)?;
    if tag != TAG_SEQUENCE {
        return Err("tbsCertificate is not a SEQUENCE");
    }
    while !tbs.is_empty() {
        let (tag, value, rest) = read_tlv(tbs)?;
        tbs = rest;
        if tag != TAG_EXTENSIONS {
            continue;
        }
        let (tag, mut extensions, _) = read_tlv(value)?;
        if tag != TAG_SEQUENCE {
            return Err("extensions are not a SEQUENCE");
        }
        while !extensions.is_empty() {
            let (tag, extension, rest) = read_tlv(extensions)?;
            extensions = rest;
            if tag != TAG_SEQUENCE {
                return Err("extension is not a SEQUENCE");
            }
            let (tag, ext_oid, mut rest) = read_tlv(extension)?;
            if tag != TAG_OID {
                return Err("extension id is not an OBJECT IDENTIFIER");
            }
            if decode_oid(ext_oid)? != oid {
                continue;
            }
            let (mut tag, mut value, after) = read_tlv(rest)?;
            if tag == TAG_BOOLEAN {
                rest = after;
                (tag, value, _) = read_tlv(rest)?;
            }
            if tag != TAG_OCTET_STRING {
                return Err("extension value is not an OCTET STRING");
            }
            return Ok(Some(value));
        }
    }
    Ok(None)
}

/// Returns the key identifier of the subjectKeyIdentifier extension, if any.
pub(crate) fn subject_key_identifier(cert_der: &[u8]) -> Result<Option<Vec<u8>>, &'static str> {
    let Some(value) = extension_value(cert_der, SUBJECT_KEY_IDENTIFIER)? else {
        return Ok(None);
    };
    let (tag, key_id, _) = read_tlv(value)?;
    if tag != TAG_OCTET_STRING {
        return Err("subjectKeyIdentifier is not an OCTET STRING");
    }
    Ok(Some(key_id.to_vec()))
}

/// Returns the serial number of the certificate `cert_der`: the content
/// octets of its INTEGER, without the leading zero octet DER adds to keep a
/// positive number positive (so it reads as the certificate's hex serial).
pub(crate) fn serial_number(cert_der: &[u8]) -> Result<Vec<u8>, &'static str> {
    let (tag, cert, _) = read_tlv(cert_der)?;
    if tag != TAG_SEQUENCE {
        return Err("certificate is not a SEQUENCE");
    }
    let (tag, tbs, _) = read_tlv(cert)?;
    if tag != TAG_SEQUENCE {
        return Err("tbsCertificate is not a SEQUENCE");
    }
    let (mut tag, mut value, rest) = read_tlv(tbs)?;
    if tag == 0xa0 {
        // [0] version
        (tag, value, _) = read_tlv(rest)?;
    }
    if tag != TAG_INTEGER || value.is_empty() {
        return Err("serialNumber is not an INTEGER");
    }
    if value[0] & 0x80 != 0 {
        return Err("serialNumber is negative");
    }
    match value {
        [0, rest @ ..] if !rest.is_empty() => Ok(rest.to_vec()),
        _ => Ok(value.to_vec()),
    }
}

/// Returns the keyIdentifier of the authorityKeyIdentifier extension, if any.
#[cfg(test)]
pub(crate) fn authority_key_identifier(cert_der: &[u8]) -> Result<Option<Vec<u8>>, &'static str> {
    let Some(value) = extension_value(cert_der, AUTHORITY_KEY_IDENTIFIER)? else {
        return Ok(None);
    };
    let (tag, mut fields, _) = read_tlv(value)?;
    if tag != TAG_SEQUENCE {
        return Err("authorityKeyIdentifier is not a SEQUENCE");
    }
    while !fields.is_empty() {
        let (tag, field, rest) = read_tlv(fields)?;
        fields = rest;
        if tag == 0x80 {
            return Ok(Some(field.to_vec()));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_common_name_oid() {
        assert_eq!(decode_oid(&[0x55, 0x04, 0x03]).unwrap(), COMMON_NAME);
        // 1.2.840.10045.4.3.2 (ecdsa-with-SHA256)
        assert_eq!(
            decode_oid(&[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02]).unwrap(),
            vec![1, 2, 840, 10045, 4, 3, 2]
        );
    }

    #[test]
    fn parses_a_two_attribute_name() {
        // SET { SEQ { OID 2.5.4.3, UTF8String "ab" } } SET { SEQ { OID 2.5.4.10, PrintableString "P" } }
        let der = [
            0x31, 0x0b, 0x30, 0x09, 0x06, 0x03, 0x55, 0x04, 0x03, 0x0c, 0x02, b'a', b'b', 0x31, 0x0a, 0x30, 0x08, 0x06,
            0x03, 0x55, 0x04, 0x0a, 0x13, 0x01, b'P',
        ];
        let attrs = parse_name(&der).unwrap();
        assert_eq!(attrs.len(), 2);
        assert_eq!(attrs[0].oid, COMMON_NAME);
        assert_eq!(directory_string(&attrs[0]), Some("ab"));
        assert_eq!(attrs[1].oid, vec![2, 5, 4, 10]);
        assert_eq!(attrs[1].tag, 0x13);
    }

    #[test]
    fn rejects_truncated_input() {
        assert!(parse_name(&[0x31, 0x0b, 0x30]).is_err());
        assert!(parse_name(&[0x31]).is_err());
    }
}
