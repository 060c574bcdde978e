package model

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
)

// JSON is the JSON scalar: a value that is already encoded, such as an
// object's summary columns or a live manifest. It is written to responses
// as is, so a summary the collector produced never takes a decode/encode
// round trip per request.
type JSON json.RawMessage

// MarshalGQL writes the value unchanged, or null when it is empty.
func (j JSON) MarshalGQL(w io.Writer) {
	if len(j) == 0 {
		_, _ = io.WriteString(w, "null")
		return
	}
	_, _ = w.Write(j)
}

// UnmarshalGQL accepts any input value and keeps its JSON encoding. No
// argument of the schema uses JSON today; this exists because gqlgen
// requires both directions for a scalar.
func (j *JSON) UnmarshalGQL(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("JSON scalar: %w", err)
	}
	*j = JSON(bytes.TrimSpace(b))
	return nil
}
