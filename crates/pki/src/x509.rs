//! What the PKI reads from certificates beyond what rustls-webpki exposes,
//! through `x509-parser` (rusticata's X.509 parser, fuzzed upstream): the
//! subject's attributes (a train certificate's common name; the CA subject,
//! rebuilt attribute by attribute so that issued leaves carry it byte for
//! byte as their issuer), the serial number, and the key identifiers.
//!
//! A certificate is input from a peer (every train presents one to the
//! proxy), so the parsing is left to a maintained library rather than a
//! DER reader of our own.

use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::ParsedExtension;
use x509_parser::prelude::FromDer as _;

/// One `AttributeTypeAndValue` of a certificate's subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Attribute {
    /// The attribute type as OID arcs, e.g. `[2, 5, 4, 3]` for commonName.
    pub oid: Vec<u64>,
    /// The ASN.1 tag of the value (e.g. 12 UTF8String, 19 PrintableString).
    pub tag: u32,
    /// The value's content octets.
    pub value: Vec<u8>,
}

/// OID of the X.520 commonName attribute.
pub(crate) const COMMON_NAME: &[u64] = &[2, 5, 4, 3];

/// The certificate `der`, parsed; the whole input must be the certificate.
fn parse(der: &[u8]) -> Result<X509Certificate<'_>, String> {
    match X509Certificate::from_der(der) {
        Ok(([], cert)) => Ok(cert),
        Ok((rest, _)) => Err(format!("{} bytes after the certificate", rest.len())),
        Err(e) => Err(format!("not an X.509 certificate: {e}")),
    }
}

/// The subject's attributes, in order. Only single-valued RDNs are accepted:
/// that is all rcgen (and nearly every CA) produces, and a multi-valued one
/// could not be rebuilt byte for byte.
pub(crate) fn subject_attributes(cert_der: &[u8]) -> Result<Vec<Attribute>, String> {
    let cert = parse(cert_der)?;
    let mut out = Vec::new();
    for rdn in cert.subject().iter() {
        let [atv] = rdn.iter().collect::<Vec<_>>()[..] else {
            return Err("multi-valued RelativeDistinguishedName is not supported".into());
        };
        let oid = atv.attr_type().iter().ok_or("an attribute type has an OID arc over 64 bits")?.collect::<Vec<u64>>();
        let value = atv.attr_value();
        out.push(Attribute { oid, tag: value.header.tag().0, value: value.data.to_vec() });
    }
    Ok(out)
}

/// The decoded string of a directory string value, if its type is one that
/// can carry a train id (UTF8String, PrintableString or IA5String).
pub(crate) fn directory_string(attr: &Attribute) -> Option<&str> {
    match attr.tag {
        12 | 19 | 22 => std::str::from_utf8(&attr.value).ok(),
        _ => None,
    }
}

/// The key identifier of the subjectKeyIdentifier extension, if any.
pub(crate) fn subject_key_identifier(cert_der: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let cert = parse(cert_der)?;
    for ext in cert.extensions() {
        if let ParsedExtension::SubjectKeyIdentifier(k) = ext.parsed_extension() {
            return Ok(Some(k.0.to_vec()));
        }
    }
    Ok(None)
}

/// The serial number of the certificate: the content octets of its INTEGER
/// without the leading zero octet DER adds to keep a positive number
/// positive (so it reads as the certificate's hex serial).
pub(crate) fn serial_number(cert_der: &[u8]) -> Result<Vec<u8>, String> {
    let cert = parse(cert_der)?;
    match cert.tbs_certificate.raw_serial() {
        [] => Err("the serialNumber is empty".into()),
        [first, ..] if first & 0x80 != 0 => Err("the serialNumber is negative".into()),
        [0, rest @ ..] if !rest.is_empty() => Ok(rest.to_vec()),
        octets => Ok(octets.to_vec()),
    }
}

/// The keyIdentifier of the authorityKeyIdentifier extension, if any.
#[cfg(test)]
pub(crate) fn authority_key_identifier(cert_der: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let cert = parse(cert_der)?;
    for ext in cert.extensions() {
        if let ParsedExtension::AuthorityKeyIdentifier(aki) = ext.parsed_extension() {
            return Ok(aki.key_identifier.as_ref().map(|k| k.0.to_vec()));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(names: &[(rcgen::DnType, &str)], serial: Option<Vec<u8>>) -> Vec<u8> {
        let mut p = rcgen::CertificateParams::default();
        p.distinguished_name = rcgen::DistinguishedName::new();
        for (t, v) in names {
            p.distinguished_name.push(t.clone(), *v);
        }
        p.serial_number = serial.map(|s| rcgen::SerialNumber::from_slice(&s));
        let key = rcgen::KeyPair::generate().unwrap();
        p.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn reads_the_subject_in_order() {
        let der = cert(&[(rcgen::DnType::CommonName, "ab"), (rcgen::DnType::OrganizationName, "P")], None);
        let attrs = subject_attributes(&der).unwrap();
        assert_eq!(attrs.len(), 2);
        assert_eq!(attrs[0].oid, COMMON_NAME);
        assert_eq!(directory_string(&attrs[0]), Some("ab"));
        assert_eq!(attrs[1].oid, vec![2, 5, 4, 10]);
        assert_eq!(directory_string(&attrs[1]), Some("P"));
    }

    #[test]
    fn reads_the_serial_without_the_sign_octet() {
        let der = cert(&[], Some(vec![0x00, 0x9a, 0x01]));
        assert_eq!(serial_number(&der).unwrap(), vec![0x9a, 0x01]);
        let der = cert(&[], Some(vec![0x12, 0x34]));
        assert_eq!(serial_number(&der).unwrap(), vec![0x12, 0x34]);
    }

    #[test]
    fn refuses_what_is_not_one_certificate() {
        let der = cert(&[(rcgen::DnType::CommonName, "ab")], None);
        assert!(subject_attributes(&der[..der.len() - 1]).is_err(), "truncated");
        assert!(subject_attributes(&[0x30]).is_err());
        let mut two = der.clone();
        two.push(0);
        assert!(subject_attributes(&two).unwrap_err().contains("after the certificate"));
        assert!(serial_number(b"garbage").is_err());
        assert!(subject_key_identifier(&[]).is_err());
    }
}
