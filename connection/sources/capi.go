package sources

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Names of the Weave GitOps and Cluster API sources, and the API groups and
// resources they read.
const (
	GitopsClusterSource = "gitopscluster"
	CAPISource          = "capi"

	GitopsGroup    = "gitops.weave.works"
	GitopsResource = "gitopsclusters"
	CAPIGroup      = "cluster.x-k8s.io"
	CAPIResource   = "clusters"
)

// Keys of the kubeconfig in the Secrets the two sources read.
var (
	// gitopsSecretKeys are where Weave GitOps looks for the kubeconfig of
	// a GitopsCluster's spec.secretRef, in order.
	gitopsSecretKeys = []string{"value", "value.yaml"}
	// capiSecretKey is where Cluster API writes a cluster's kubeconfig, in
	// the Secret "<cluster>-kubeconfig".
	capiSecretKey = "value"
)

// gitopsCluster is the part of a Weave GitOps GitopsCluster
// (gitops.weave.works/v1alpha1) fleetgraph reads.
type gitopsCluster struct {
	Spec struct {
		// SecretRef names a Secret of the same namespace holding a
		// kubeconfig under "value" or "value.yaml".
		SecretRef *localRef `json:"secretRef,omitempty"`
		// CAPIClusterRef names a Cluster API Cluster of the same
		// namespace instead.
		CAPIClusterRef *localRef `json:"capiClusterRef,omitempty"`
	} `json:"spec"`
}

type localRef struct {
	Name string `json:"name"`
}

// capiCluster is the part of a Cluster API Cluster fleetgraph reads.
type capiCluster struct {
	Status struct {
		Phase string `json:"phase,omitempty"`
	} `json:"status"`
}

// NewGitopsClusters returns the source of Weave GitOps GitopsClusters:
// each is a cluster named after it, with its labels, reached
// with the kubeconfig of its spec.secretRef Secret, or with the kubeconfig
// Secret of the Cluster API cluster its spec.capiClusterRef names.
func NewGitopsClusters(opts Options) Source { return &crdSource{name: GitopsClusterSource, opts: opts} }

// NewCAPI returns the source of Cluster API Clusters: each is a cluster
// named after it, with its labels, reached with the kubeconfig Cluster API
// keeps in the Secret "<name>-kubeconfig" (key "value").
func NewCAPI(opts Options) Source { return &crdSource{name: CAPISource, opts: opts} }

// crdSource is a source whose objects are custom resources pointing at
// kubeconfig Secrets of their own namespace.
type crdSource struct {
	name string
	opts Options
}

func (s *crdSource) Name() string { return s.name }

func (s *crdSource) Run(ctx context.Context, r *Registry) error {
	c, err := newClients(s.opts.Management)
	if err != nil {
		return err
	}
	w := newWatcher(s.name, r, logger(s.opts.Logger))
	group, resource := GitopsGroup, GitopsResource
	if s.name == CAPISource {
		group, resource = CAPIGroup, CAPIResource
	}
	gvr, ok := waitForResource(ctx, w, c.discovery, group, resource)
	if !ok {
		return nil
	}
	inf, err := dynamicInformer(c, w, gvr, s.opts.Namespace)
	if err != nil {
		return err
	}
	secrets, err := newSecretRefs(c, w, s.opts.Namespace)
	if err != nil {
		return err
	}
	if s.name == CAPISource {
		return w.run(ctx, func() []Claim {
			var out []Claim
			eachObject(inf, func(u *unstructured.Unstructured, obj *capiCluster, err error) {
				out = append(out, capiClaim(secrets, u, obj, err))
			})
			return out
		})
	}
	return w.run(ctx, func() []Claim {
		var out []Claim
		eachObject(inf, func(u *unstructured.Unstructured, obj *gitopsCluster, err error) {
			out = append(out, gitopsClaim(secrets, u, obj, err))
		})
		return out
	})
}

func gitopsClaim(secrets *secretRefs, u *unstructured.Unstructured, gc *gitopsCluster, err error) Claim {
	ns, ref := u.GetNamespace(), objectRef(u)
	c := Claim{
		Object: ref, Cluster: clusterName(u, u.GetName()),
		Labels: clusterLabels(GitopsClusterSource, u),
	}
	spec := gc.Spec
	switch {
	case err != nil:
		c.Config, c.Version = failing(err), "invalid"
	case spec.SecretRef != nil && spec.CAPIClusterRef != nil:
		c.Config, c.Version = failing(fmt.Errorf("GitopsCluster %s sets both spec.secretRef and spec.capiClusterRef; set one", ref)), "invalid"
	case spec.SecretRef != nil && spec.SecretRef.Name != "":
		name := spec.SecretRef.Name
		c.Config = secrets.kubeconfig(ns, name, "spec.secretRef of GitopsCluster "+ref, gitopsSecretKeys...)
		c.Version = "secret " + name + " " + secrets.version(ns, name)
	case spec.CAPIClusterRef != nil && spec.CAPIClusterRef.Name != "":
		name := spec.CAPIClusterRef.Name + "-kubeconfig"
		c.Config = secrets.kubeconfig(ns, name, "kubeconfig of the Cluster API cluster in spec.capiClusterRef of GitopsCluster "+ref, capiSecretKey)
		c.Version = "capi " + name + " " + secrets.version(ns, name)
	default:
		c.Config, c.Version = failing(fmt.Errorf("GitopsCluster %s has neither spec.secretRef nor spec.capiClusterRef", ref)), "invalid"
	}
	return c
}

func capiClaim(secrets *secretRefs, u *unstructured.Unstructured, cc *capiCluster, err error) Claim {
	ns, ref := u.GetNamespace(), objectRef(u)
	c := Claim{
		Object: ref, Cluster: clusterName(u, u.GetName()),
		Labels: clusterLabels(CAPISource, u),
	}
	if err != nil {
		c.Config, c.Version = failing(err), "invalid"
		return c
	}
	name := u.GetName() + "-kubeconfig"
	what := "kubeconfig of Cluster API cluster " + ref
	if cc.Status.Phase != "" {
		what += ", phase " + cc.Status.Phase
	}
	c.Config = secrets.kubeconfig(ns, name, what, capiSecretKey)
	c.Version = name + " " + secrets.version(ns, name)
	return c
}
