package index

import (
	"context"
	"reflect"
	"testing"
)

// TestSinkIsEveryWrite keeps Sink complete: a replicated index is fed
// exactly the Sink calls, so a write that is not one would be lost on
// every replica. A Store method that takes a context and returns only an
// error is taken for a write.
func TestSinkIsEveryWrite(t *testing.T) {
	// notWrites lists methods of that shape that change nothing, with the
	// reason; none so far.
	notWrites := map[string]string{}
	sink := reflect.TypeFor[Sink]()
	ctxType, errType := reflect.TypeFor[context.Context](), reflect.TypeFor[error]()
	store := reflect.TypeFor[*Store]()
	writes := 0
	for m := range store.Methods() {
		ft := m.Type // the receiver is In(0)
		if ft.NumIn() < 2 || ft.In(1) != ctxType || ft.NumOut() != 1 || ft.Out(0) != errType {
			continue
		}
		if _, ok := notWrites[m.Name]; ok {
			continue
		}
		writes++
		if _, ok := sink.MethodByName(m.Name); !ok {
			t.Errorf("(*Store).%s looks like a write but is not a Sink method: add it to Sink (and its doc), or to notWrites with the reason", m.Name)
		}
	}
	if writes != sink.NumMethod() {
		t.Errorf("%d writes found, Sink has %d methods", writes, sink.NumMethod())
	}
}
