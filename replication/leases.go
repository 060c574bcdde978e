package replication

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// LeaseRules are what a collector does with the Leases of its lease
// namespace: its informer lists and watches them, it creates and renews
// (updates) its own and its clusters', reads one before taking it over,
// reads a collector's to confirm it is dead, and deletes a cluster's on
// release. `fleetgraph rbac --lease-namespace` and
// the Helm chart's HA mode grant exactly these there.
func LeaseRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{{
		APIGroups: []string{coordinationv1.GroupName}, Resources: []string{"leases"},
		Verbs: []string{"get", "list", "watch", "create", "update", "delete"},
	}}
}

// Defaults for LeaseOptions.
const (
	// DefaultLeaseDuration is how long a collector stays the owner of its
	// clusters after its last renewal: the longest a dead collector's
	// clusters go uncollected before another takes them. Like
	// kube-controller-manager's leader election (15 s), long enough that a
	// busy API server or a garbage collection pause does not cost a
	// collector its clusters.
	DefaultLeaseDuration = 15 * time.Second
	// leaseRetry is how often a collector looks at the leases (besides
	// reacting to their changes): it bounds how late after a lease's
	// expiry the cluster is taken over.
	leaseRetry = time.Second
)

// LeaseOptions shards clusters over collectors with Kubernetes Leases
// (coordination.k8s.io/v1) in a management cluster.
type LeaseOptions struct {
	// Client reaches the management cluster; required. The collector
	// needs get, list, watch, create, update and delete on leases in
	// Namespace.
	Client kubernetes.Interface
	// Namespace holds the leases; required.
	Namespace string
	// ID names this collector among the others, the same across its
	// restarts (a pod name of a StatefulSet, a host name); required.
	ID string
	// Duration is the lease duration (DefaultLeaseDuration); a
	// collector renews its lease every third of it.
	Duration time.Duration
	// Grace is how long a push cluster stays reserved for its edge
	// instance after the edge went away (edge.DefaultGrace).
	Grace time.Duration
}

// Lease labels and annotations. A collector's lease (its liveness) is
// renewed every Duration/3; a cluster's lease names the collector
// incarnation that owns it (spec.holderIdentity, empty when released),
// and spec.leaseTransitions counts its owners: the generation that
// travels in the cluster's messages. A cluster's lease is not renewed: it
// is valid while its holder's collector lease is, so renewals cost one
// write per collector, not one per cluster.
const (
	labelLease     = "fleetgraph.io/lease" // "collector" or "cluster"
	leaseCollector = "collector"
	leaseCluster   = "cluster"
	annCollector   = "fleetgraph.io/collector"     // collector lease: the collector's ID
	annCluster     = "fleetgraph.io/cluster"       // cluster lease: the cluster's name
	annMode        = "fleetgraph.io/mode"          // cluster lease: "pull" or "push"
	annInstance    = "fleetgraph.io/edge-instance" // push: the edge instance that holds the claim
	annReleased    = "fleetgraph.io/edge-released" // push: when that edge went away (RFC 3339), if it did
	modePull       = "pull"
	modePush       = "push"
)

// leaseName turns a name into a Lease name: a DNS subdomain that keeps
// the readable part and ends in a hash, so that distinct names never
// share a Lease.
func leaseName(prefix, name string) string {
	sum := sha256.Sum256([]byte(name))
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '.':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
		if b.Len() >= 200 {
			break
		}
	}
	readable := strings.Trim(b.String(), "-.")
	return prefix + readable + "-" + hex.EncodeToString(sum[:4])
}

func collectorLeaseName(id string) string    { return leaseName("fleetgraph-collector-", id) }
func clusterLeaseName(cluster string) string { return leaseName("fleetgraph-cluster-", cluster) }

// clusterLease is a cluster's lease as read.
type clusterLease struct {
	obj        *coordinationv1.Lease
	cluster    string
	holder     string // incarnation, "" when released
	generation int32
	mode       string
	instance   string
	released   time.Time // zero while the edge is connected
}

func parseClusterLease(l *coordinationv1.Lease) (*clusterLease, bool) {
	if l.Labels[labelLease] != leaseCluster || l.Annotations[annCluster] == "" {
		return nil, false
	}
	cl := &clusterLease{
		obj: l, cluster: l.Annotations[annCluster], holder: ptr.Deref(l.Spec.HolderIdentity, ""),
		generation: ptr.Deref(l.Spec.LeaseTransitions, 0), mode: l.Annotations[annMode], instance: l.Annotations[annInstance],
	}
	if s := l.Annotations[annReleased]; s != "" {
		if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
			cl.released = t
		}
	}
	return cl, true
}

// leases reads and writes the leases. Every write is conditional on the
// resourceVersion read, so two collectors never both win a lease.
type leases struct {
	client    kubernetes.Interface
	namespace string
	duration  time.Duration
}

var errLeaseTaken = errors.New("replication: the lease changed meanwhile")

// renewCollector creates or renews a collector's lease.
func (ls *leases) renewCollector(ctx context.Context, id, incarnation string, cur *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	now := metav1.NowMicro()
	api := ls.client.CoordinationV1().Leases(ls.namespace)
	if cur == nil {
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Name: collectorLeaseName(id), Labels: map[string]string{labelLease: leaseCollector},
				Annotations: map[string]string{annCollector: id},
			},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity: &incarnation, LeaseDurationSeconds: ptr.To(int32(ls.duration / time.Second)),
				AcquireTime: &now, RenewTime: &now, LeaseTransitions: ptr.To(int32(0)),
			},
		}
		out, err := api.Create(ctx, l, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil, errLeaseTaken
		}
		if err != nil {
			return nil, fmt.Errorf("create lease %s: %w", l.Name, err)
		}
		return out, nil
	}
	l := cur.DeepCopy()
	if ptr.Deref(l.Spec.HolderIdentity, "") != incarnation {
		l.Spec.HolderIdentity, l.Spec.AcquireTime = &incarnation, &now
		l.Spec.LeaseTransitions = ptr.To(ptr.Deref(l.Spec.LeaseTransitions, 0) + 1)
	}
	l.Spec.RenewTime = &now
	l.Spec.LeaseDurationSeconds = ptr.To(int32(ls.duration / time.Second))
	out, err := api.Update(ctx, l, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil, errLeaseTaken
	}
	if err != nil {
		return nil, fmt.Errorf("renew lease %s: %w", l.Name, err)
	}
	return out, nil
}

// acquireCluster makes incarnation the holder of a cluster's lease (cur
// nil: a lease that does not exist yet), counting one more transition.
// edit sets the mode's annotations.
func (ls *leases) acquireCluster(ctx context.Context, cluster, incarnation string, cur *coordinationv1.Lease, edit func(ann map[string]string)) (*clusterLease, error) {
	now := metav1.NowMicro()
	api := ls.client.CoordinationV1().Leases(ls.namespace)
	var l *coordinationv1.Lease
	if cur == nil {
		l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
			Name: clusterLeaseName(cluster), Labels: map[string]string{labelLease: leaseCluster},
			Annotations: map[string]string{annCluster: cluster},
		}}
	} else {
		l = cur.DeepCopy()
	}
	l.Spec.HolderIdentity, l.Spec.AcquireTime, l.Spec.RenewTime = &incarnation, &now, &now
	l.Spec.LeaseDurationSeconds = ptr.To(int32(ls.duration / time.Second))
	l.Spec.LeaseTransitions = ptr.To(ptr.Deref(l.Spec.LeaseTransitions, 0) + 1)
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	edit(l.Annotations)
	var out *coordinationv1.Lease
	var err error
	if cur == nil {
		out, err = api.Create(ctx, l, metav1.CreateOptions{})
	} else {
		out, err = api.Update(ctx, l, metav1.UpdateOptions{})
	}
	switch {
	case apierrors.IsAlreadyExists(err), apierrors.IsConflict(err), apierrors.IsNotFound(err):
		return nil, errLeaseTaken
	case err != nil:
		return nil, fmt.Errorf("acquire lease of cluster %q: %w", cluster, err)
	}
	cl, _ := parseClusterLease(out)
	return cl, nil
}

// updateCluster changes a lease this collector holds (its annotations,
// or its holder to "" to release it).
func (ls *leases) updateCluster(ctx context.Context, cur *coordinationv1.Lease, edit func(l *coordinationv1.Lease)) (*clusterLease, error) {
	l := cur.DeepCopy()
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	edit(l)
	out, err := ls.client.CoordinationV1().Leases(ls.namespace).Update(ctx, l, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil, errLeaseTaken
	}
	if err != nil {
		return nil, fmt.Errorf("update lease %s: %w", l.Name, err)
	}
	cl, _ := parseClusterLease(out)
	return cl, nil
}

// getCluster reads a cluster's lease from the API server (not a cache):
// an edge's claim is decided on the lease as it is now.
func (ls *leases) getCluster(ctx context.Context, cluster string) (*clusterLease, error) {
	l, err := ls.client.CoordinationV1().Leases(ls.namespace).Get(ctx, clusterLeaseName(cluster), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the lease of cluster %q: %w", cluster, err)
	}
	cl, ok := parseClusterLease(l)
	if !ok {
		return nil, fmt.Errorf("lease %s is not a fleetgraph cluster lease", l.Name)
	}
	return cl, nil
}

// callTimeout bounds a renewal and a confirming read. Both run on the
// collector's one goroutine: one that hangs (a dead connection, which the
// HTTP/2 health check finds after about 45 s; a LIST that API Priority and
// Fairness queues) would delay the next renewal past the collector's own
// lease, and the others would take its clusters. A third of the lease
// duration, the renewal interval: a renewal that times out is retried in
// the next round, with two thirds of the lease left (client-go's
// leaderelection bounds its renewals the same way, with RenewDeadline).
func (ls *leases) callTimeout() time.Duration { return ls.duration / 3 }

// getCollector reads a collector's lease from the API server (nil: there
// is none).
func (ls *leases) getCollector(ctx context.Context, id string) (*coordinationv1.Lease, error) {
	l, err := ls.client.CoordinationV1().Leases(ls.namespace).Get(ctx, collectorLeaseName(id), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the lease of collector %q: %w", id, err)
	}
	return l, nil
}

// deleteCluster removes the lease of a cluster that left the inventory.
func (ls *leases) deleteCluster(ctx context.Context, cur *coordinationv1.Lease) error {
	err := ls.client.CoordinationV1().Leases(ls.namespace).Delete(ctx, cur.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{ResourceVersion: &cur.ResourceVersion},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete lease %s: %w", cur.Name, err)
	}
	return nil
}
