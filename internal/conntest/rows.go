package conntest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

// Truth lists every object of kinds (RBAC kinds aside) from the API server
// directly and returns kind.group/namespace/name -> resourceVersion, as
// RowVersions does for the index.
func Truth(t testing.TB, c *testcluster.Cluster, kinds []index.Kind) map[string]string {
	t.Helper()
	dyn := dynamic.NewForConfigOrDie(c.DirectConfig)
	out := map[string]string{}
	for _, k := range kinds {
		if k.Group == index.RBACGroup {
			continue
		}
		gvr := schema.GroupVersionResource{Group: k.Group, Version: k.Version, Resource: k.Resource}
		list, err := dyn.Resource(gvr).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatalf("list %s: %v", gvr, err)
		}
		for _, o := range list.Items {
			out[fmt.Sprintf("%s.%s/%s/%s", k.Kind, k.Group, o.GetNamespace(), o.GetName())] = o.GetResourceVersion()
		}
	}
	return out
}

// AllRows returns every object row of a cluster in the index, paging
// through it as a client would.
func AllRows(t testing.TB, store *index.Store, cluster string) []*index.Object {
	t.Helper()
	var out []*index.Object
	after := ""
	for {
		page, err := store.Query(context.Background(), index.Query{
			Filter: index.Filter{Clusters: []string{cluster}}, First: index.MaxPageSize, After: after,
			Access: &index.Access{All: true},
		})
		if err != nil {
			t.Fatalf("query: %v", err)
		}
		for _, e := range page.Edges {
			out = append(out, e.Object)
		}
		if !page.HasNextPage {
			return out
		}
		after = page.Edges[len(page.Edges)-1].Cursor
	}
}

// RowVersions returns every row of a cluster in the index as Truth does,
// failing the test if a row is listed twice.
func RowVersions(t testing.TB, store *index.Store, cluster string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, o := range AllRows(t, store, cluster) {
		k := fmt.Sprintf("%s.%s/%s/%s", o.Kind, o.Group, o.Namespace, o.Name)
		if _, dup := out[k]; dup {
			t.Fatalf("row %s listed twice", k)
		}
		out[k] = o.ResourceVersion
	}
	return out
}

// DiffKeys describes how got differs from want: keys missing, extra, or
// with another value.
func DiffKeys(want, got map[string]string) error {
	var missing, extra, changed []string
	for k, v := range want {
		switch g, ok := got[k]; {
		case !ok:
			missing = append(missing, k)
		case g != v:
			changed = append(changed, fmt.Sprintf("%s rv %s!=%s", k, g, v))
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			extra = append(extra, k)
		}
	}
	if len(missing)+len(extra)+len(changed) == 0 {
		return nil
	}
	slices.Sort(missing)
	slices.Sort(extra)
	slices.Sort(changed)
	return errors.New(fmt.Sprint("missing ", Head(missing), " extra ", Head(extra), " stale ", Head(changed)))
}

// Head prints at most the first five of s, and how many there are.
func Head(s []string) string {
	if len(s) > 5 {
		return fmt.Sprintf("%v... (%d)", s[:5], len(s))
	}
	return fmt.Sprint(s)
}

// Eventually retries check until it returns nil or timeout passes, and
// returns how long it took.
func Eventually(t testing.TB, timeout time.Duration, what string, check func() error) time.Duration {
	t.Helper()
	start := time.Now()
	var err error
	for time.Since(start) < timeout {
		if err = check(); err == nil {
			return time.Since(start)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: not true within %s: %v", what, timeout, err)
	return 0
}
