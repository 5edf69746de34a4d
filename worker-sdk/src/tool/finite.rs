//! Finds a float that is not finite (NaN, an infinity) in a value about to become JSON.
//!
//! serde_json writes such a float as `null` without an error, so a tool returning `f64::NAN`
//! would record `null` as its result. The seeds call that result unserializable, an error naming
//! the tool. This serializer goes through the value and fails on the first such float; the result
//! path runs it only when the JSON it got holds a `null`, so a result without one pays nothing.

use serde::ser::{self, Serialize};

/// Whether `value` holds a float that is not finite.
pub(crate) fn has_non_finite<T: Serialize + ?Sized>(value: &T) -> bool {
    value.serialize(Finder).is_err()
}

#[derive(Debug)]
struct Found;

impl std::fmt::Display for Found {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a float that is not finite")
    }
}

impl std::error::Error for Found {}

impl ser::Error for Found {
    fn custom<M: std::fmt::Display>(_: M) -> Self {
        // A value that fails to serialize for another reason is left to serde_json to report.
        Found
    }
}

struct Finder;

type Done = Result<(), Found>;

macro_rules! fine {
    ($($method:ident($($arg:ty),*);)*) => {
        $(fn $method(self, $(_: $arg),*) -> Done { Ok(()) })*
    };
}

impl ser::Serializer for Finder {
    type Ok = ();
    type Error = Found;
    type SerializeSeq = Finder;
    type SerializeTuple = Finder;
    type SerializeTupleStruct = Finder;
    type SerializeTupleVariant = Finder;
    type SerializeMap = Finder;
    type SerializeStruct = Finder;
    type SerializeStructVariant = Finder;

    fine! {
        serialize_bool(bool); serialize_i8(i8); serialize_i16(i16); serialize_i32(i32); serialize_i64(i64);
        serialize_i128(i128); serialize_u8(u8); serialize_u16(u16); serialize_u32(u32); serialize_u64(u64);
        serialize_u128(u128); serialize_char(char); serialize_str(&str); serialize_bytes(&[u8]);
        serialize_none(); serialize_unit(); serialize_unit_struct(&'static str);
        serialize_unit_variant(&'static str, u32, &'static str);
    }

    fn serialize_f32(self, v: f32) -> Done {
        if v.is_finite() { Ok(()) } else { Err(Found) }
    }

    fn serialize_f64(self, v: f64) -> Done {
        if v.is_finite() { Ok(()) } else { Err(Found) }
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Done {
        value.serialize(self)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> Done {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        value: &T,
    ) -> Done {
        value.serialize(self)
    }

    fn serialize_seq(self, _: Option<usize>) -> Result<Finder, Found> {
        Ok(self)
    }

    fn serialize_tuple(self, _: usize) -> Result<Finder, Found> {
        Ok(self)
    }

    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Finder, Found> {
        Ok(self)
    }

    fn serialize_tuple_variant(self, _: &'static str, _: u32, _: &'static str, _: usize) -> Result<Finder, Found> {
        Ok(self)
    }

    fn serialize_map(self, _: Option<usize>) -> Result<Finder, Found> {
        Ok(self)
    }

    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Finder, Found> {
        Ok(self)
    }

    fn serialize_struct_variant(self, _: &'static str, _: u32, _: &'static str, _: usize) -> Result<Finder, Found> {
        Ok(self)
    }
}

/// Every compound visits its parts with a new finder.
macro_rules! compound {
    ($($trait:ident { $($method:ident),* })*) => {
        $(impl ser::$trait for Finder {
            type Ok = ();
            type Error = Found;
            $(fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Done {
                value.serialize(Finder)
            })*
            fn end(self) -> Done {
                Ok(())
            }
        })*
    };
}

compound! {
    SerializeSeq { serialize_element }
    SerializeTuple { serialize_element }
    SerializeTupleStruct { serialize_field }
    SerializeTupleVariant { serialize_field }
    SerializeMap { serialize_key, serialize_value }
}

/// Every struct visits its fields' values with a new finder.
macro_rules! fields {
    ($($trait:ident)*) => {
        $(impl ser::$trait for Finder {
            type Ok = ();
            type Error = Found;
            fn serialize_field<T: Serialize + ?Sized>(&mut self, _: &'static str, value: &T) -> Done {
                value.serialize(Finder)
            }
            fn end(self) -> Done {
                Ok(())
            }
        })*
    };
}

fields! { SerializeStruct SerializeStructVariant }

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::has_non_finite;

    #[derive(serde::Serialize)]
    struct Ratio {
        name: String,
        values: Vec<Option<f64>>,
        by_key: BTreeMap<String, (f32, u8)>,
    }

    #[test]
    fn finds_a_non_finite_float_wherever_it_is() {
        assert!(has_non_finite(&f64::NAN));
        assert!(has_non_finite(&f32::INFINITY));
        assert!(has_non_finite(&vec![Some(1.0), None, Some(f64::NEG_INFINITY)]));
        let nested = Ratio {
            name: "r".into(),
            values: vec![Some(0.5), None],
            by_key: BTreeMap::from([("k".to_owned(), (f32::NAN, 1))]),
        };
        assert!(has_non_finite(&nested));
    }

    #[test]
    fn finite_values_and_nulls_pass() {
        assert!(!has_non_finite(
            &serde_json::json!({"a": null, "b": [1.5, -2e300], "c": "NaN"})
        ));
        let finite = Ratio {
            name: "r".into(),
            values: vec![Some(0.5), None],
            by_key: BTreeMap::from([("k".to_owned(), (1.0, 1))]),
        };
        assert!(!has_non_finite(&finite));
        assert!(!has_non_finite(&()));
    }
}
