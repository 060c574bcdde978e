package index

import (
	"encoding/json"
	"iter"
	"slices"
	"strings"
	"unicode/utf8"
	"unsafe"

	"k8s.io/apimachinery/pkg/labels"
)

// Labels is an object's labels: an immutable list of key=value pairs,
// sorted by key, each key once. Selectors match it directly (it is a
// k8s.io/apimachinery labels.Labels), and it marshals to the JSON object a
// map[string]string gave.
//
// It is a list rather than a map because the index returns a new Object
// for each row a page has not returned lately, and a map per row cost a
// small page of such rows two allocations and a hashed insert per label,
// plus a table of maps by label set kept to share them: about 5 µs of
// the 23 µs of CPU of compare's Q2 page of four random rows at 1M
// objects. A page's Labels share one allocation, filled with the strings
// the label dictionary holds, in key order, which is also the order
// GraphQL and the wire formats want (see docs/design.md).
//
// The zero Labels has no labels. A Labels shares its pairs: copies of it
// are cheap and equal, and nothing can change them.
type Labels struct {
	kv []labelKV
}

// labelKV is one label of a Labels.
type labelKV struct{ key, value string }

// Labels satisfies the selector's interface, so that sel.Matches(&o.Labels)
// needs no conversion. Pass a pointer: a Labels value in an interface is
// copied to the heap, an allocation per call.
var (
	_ labels.Labels = Labels{}
	_ labels.Labels = (*Labels)(nil)
)

// LabelsOf returns the labels of m, a copy (the strings are shared). A nil
// or empty m gives the zero Labels.
func LabelsOf(m map[string]string) Labels {
	if len(m) == 0 {
		return Labels{}
	}
	kv := make([]labelKV, 0, len(m))
	for k, v := range m {
		kv = append(kv, labelKV{k, v})
	}
	slices.SortFunc(kv, compareLabelKV)
	return Labels{kv: kv}
}

// compareLabelKV orders labels by key.
func compareLabelKV(a, b labelKV) int { return strings.Compare(a.key, b.key) }

// sortLabels sorts kv by key in place: an insertion sort, since a row has
// a few labels and the keys compared are short and in cache.
func sortLabels(kv []labelKV) {
	for i := 1; i < len(kv); i++ {
		for j := i; j > 0 && kv[j].key < kv[j-1].key; j-- {
			kv[j], kv[j-1] = kv[j-1], kv[j]
		}
	}
}

// Len returns the number of labels.
func (l Labels) Len() int { return len(l.kv) }

// At returns label i in key order, for 0 <= i < Len().
func (l Labels) At(i int) (key, value string) { return l.kv[i].key, l.kv[i].value }

// find returns the index of key and whether it is there.
func (l Labels) find(key string) (int, bool) {
	lo, hi := 0, len(l.kv)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if l.kv[m].key < key {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, lo < len(l.kv) && l.kv[lo].key == key
}

// Lookup returns the value of key and whether it is there.
func (l Labels) Lookup(key string) (string, bool) {
	if i, ok := l.find(key); ok {
		return l.kv[i].value, true
	}
	return "", false
}

// Get returns the value of key, "" when it is not there.
func (l Labels) Get(key string) string {
	v, _ := l.Lookup(key)
	return v
}

// Has reports whether key is there.
func (l Labels) Has(key string) bool {
	_, ok := l.find(key)
	return ok
}

// All returns the labels in key order.
func (l Labels) All() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		for _, kv := range l.kv {
			if !yield(kv.key, kv.value) {
				return
			}
		}
	}
}

// Map returns a new map of the labels, which the caller may change.
func (l Labels) Map() map[string]string {
	m := make(map[string]string, len(l.kv))
	for _, kv := range l.kv {
		m[kv.key] = kv.value
	}
	return m
}

// Equal reports whether l and o have the same labels.
func (l Labels) Equal(o Labels) bool { return slices.Equal(l.kv, o.kv) }

// IsZero reports whether there are no labels: `json:",omitzero"` omits
// them then, as `json:",omitempty"` omitted a nil or empty map.
func (l Labels) IsZero() bool { return len(l.kv) == 0 }

// String returns the labels as "key=value,key=value" in key order, for
// messages.
func (l Labels) String() string {
	var b strings.Builder
	for i, kv := range l.kv {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(kv.key)
		b.WriteByte('=')
		b.WriteString(kv.value)
	}
	return b.String()
}

// MarshalJSON returns the labels as encoding/json marshals a
// map[string]string of them: an object with the keys in byte order ({}
// for none, where a nil map gave null: Object omits them either way).
// encoding/json escapes <, > and & of the result afterwards when it
// escapes HTML (Marshal does, an Encoder may not), so they are left as
// they are here, as a map's strings were.
func (l Labels) MarshalJSON() ([]byte, error) {
	n := 2
	for _, kv := range l.kv {
		n += len(kv.key) + len(kv.value) + 6
	}
	b := make([]byte, 0, n)
	b = append(b, '{')
	for i, kv := range l.kv {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, kv.key)
		b = append(b, ':')
		b = appendJSONString(b, kv.value)
	}
	return append(b, '}'), nil
}

// UnmarshalJSON sets the labels to those of a JSON object of strings,
// accepting and rejecting what decoding into a map[string]string did
// (null gives no labels; a key given twice keeps its last value). It
// replaces the labels, where decoding into a non-nil map added to it.
//
// It decodes the object straight into the sorted pairs: one allocation
// for the pairs and one for the bytes of all their strings, where a map
// and LabelsOf cost the map, a string per key and value and the pairs
// (review-s10-index L7: the edge hub decodes every row it is sent this
// way). Input that way does not take (a string with an escape, a control
// character or invalid UTF-8, or anything but an object of strings,
// errors included) is decoded through a map as before, so that the
// results and errors are the map's (FuzzLabelsUnmarshalJSON).
//
// So is an object with more than maxDirectLabels members, or with a key
// given twice, which an honest edge never sends (it marshals a map): the
// pairs and bytes made here are sized by the members, so a row of
// hundreds of thousands of one key repeated would hold them for a single
// label, and the bytes of every value given before the last (review-s11
// L1). Through the map the labels hold only what they keep. Such an
// object is decoded, not refused: refusing would make a decoding error of
// what the map accepted, and the labels quota, checked after decoding,
// is the one place that rejects too many labels (a row reject, where a
// decoding error refuses the whole message).
func (l *Labels) UnmarshalJSON(b []byte) error {
	n, size := 0, 0
	if !scanLabelsJSON(b, func(key, value []byte) { n, size = n+1, size+len(key)+len(value) }) || n > maxDirectLabels {
		return l.unmarshalViaMap(b)
	}
	if n == 0 {
		*l = Labels{}
		return nil
	}
	// The strings as scanLabelsJSON found them (raw is what they decode
	// to, as it takes only strings without escapes), one after the other.
	buf := make([]byte, 0, size)
	scanLabelsJSON(b, func(key, value []byte) { buf = append(append(buf, key...), value...) })
	all := unsafe.String(unsafe.SliceData(buf), len(buf)) // buf is not written again
	kv := make([]labelKV, 0, n)
	off := 0
	scanLabelsJSON(b, func(key, value []byte) {
		k, v := off+len(key), off+len(key)+len(value)
		kv = append(kv, labelKV{all[off:k], all[k:v]})
		off = v
	})
	// Not an insertion sort (sortLabels): a row's labels are not counted
	// against the quota until decoded.
	slices.SortFunc(kv, compareLabelKV)
	for i := 1; i < len(kv); i++ {
		if kv[i].key == kv[i-1].key {
			return l.unmarshalViaMap(b)
		}
	}
	*l = Labels{kv: kv}
	return nil
}

// maxDirectLabels is the most members UnmarshalJSON decodes straight into
// pairs: eight times the default labels quota (128, Quotas.LabelsPerRow
// in connection/edge, which index does not import), so that no row an
// honest edge sends under that quota goes through the map.
const maxDirectLabels = 1024

// unmarshalViaMap sets the labels to those of b decoded into a
// map[string]string.
func (l *Labels) unmarshalViaMap(b []byte) error {
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	*l = LabelsOf(m)
	return nil
}

// scanLabelsJSON calls fn with the key and value of each member of b, a
// JSON object of strings (or null, which has none), as the raw bytes
// between their quotes, and reports whether b is one it takes: valid
// JSON, and no string with an escape, a control character (invalid) or
// invalid UTF-8 (which decodes to U+FFFD), so that each string's raw bytes
// are what it decodes to. When it returns false, fn may have been called
// for some members.
func scanLabelsJSON(b []byte, fn func(key, value []byte)) bool {
	i := skipJSONSpace(b, 0)
	if rest := b[i:]; len(rest) >= 4 && string(rest[:4]) == "null" {
		return skipJSONSpace(b, i+4) == len(b)
	}
	if i == len(b) || b[i] != '{' {
		return false
	}
	if i = skipJSONSpace(b, i+1); i < len(b) && b[i] == '}' {
		return skipJSONSpace(b, i+1) == len(b)
	}
	for {
		key, j, ok := scanJSONString(b, i)
		if !ok {
			return false
		}
		if i = skipJSONSpace(b, j); i == len(b) || b[i] != ':' {
			return false
		}
		value, j, ok := scanJSONString(b, skipJSONSpace(b, i+1))
		if !ok {
			return false
		}
		fn(key, value)
		if i = skipJSONSpace(b, j); i == len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i = skipJSONSpace(b, i+1)
		case '}':
			return skipJSONSpace(b, i+1) == len(b)
		default:
			return false
		}
	}
}

// skipJSONSpace returns the index of the first byte of b from i on that is
// not JSON whitespace.
func skipJSONSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// scanJSONString returns the bytes between the quotes of the JSON string
// at b[i] and the index after it, if it is a string scanLabelsJSON takes
// (see there).
func scanJSONString(b []byte, i int) (s []byte, next int, ok bool) {
	if i == len(b) || b[i] != '"' {
		return nil, i, false
	}
	ascii := true
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			s = b[i+1 : j]
			return s, j + 1, ascii || utf8.Valid(s)
		case c == '\\' || c < 0x20:
			return nil, j, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return nil, len(b), false
}

// appendJSONString appends s as a JSON string the way encoding/json
// writes a string without HTML escaping: ", \ and control characters
// escaped (\b, \f, \n, \r, \t by name), invalid UTF-8 as \ufffd, and
// U+2028 and U+2029 escaped. TestLabelsJSON compares it with
// encoding/json on every byte and on invalid and separator sequences.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			if size == 1 {
				b = append(b, `\ufffd`...)
			} else {
				b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xF])
			}
			start = i + size
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
