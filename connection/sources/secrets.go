package sources

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/fleetgraph/fleetgraph/connection"
)

// SecretsSource is the name of fleetgraph's own source: labelled Secrets
// holding a kubeconfig.
const SecretsSource = "secrets"

// SecretKubeconfigKey is the data key of a cluster Secret's kubeconfig.
const SecretKubeconfigKey = "kubeconfig"

// NewSecrets returns the source of labelled cluster Secrets in
// Options.SecretsNamespace: each Secret matching Options.SecretsSelector
// holds a kubeconfig under SecretKubeconfigKey whose current context is
// the cluster. The cluster is named by the ClusterNameKey label, else by
// the Secret; its labels are the Secret's.
func NewSecrets(opts Options) Source { return &secretSource{opts: opts} }

type secretSource struct{ opts Options }

func (s *secretSource) Name() string { return SecretsSource }

func (s *secretSource) Run(ctx context.Context, r *Registry) error {
	if s.opts.SecretsNamespace == "" {
		return fmt.Errorf("source %s: the namespace of the cluster Secrets is required", SecretsSource)
	}
	selector := s.opts.SecretsSelector
	if selector == "" {
		selector = DefaultSecretsSelector
	}
	c, err := newClients(s.opts.Management)
	if err != nil {
		return err
	}
	w := newWatcher(SecretsSource, r, logger(s.opts.Logger))
	inf := labelledSecrets(c, s.opts.SecretsNamespace, selector)
	if err := w.add(inf); err != nil {
		return err
	}
	return w.run(ctx, func() []Claim {
		var out []Claim
		for _, obj := range inf.GetStore().List() {
			sec, ok := obj.(*corev1.Secret)
			if !ok {
				continue
			}
			data := sec.Data[SecretKubeconfigKey]
			ref := objectRef(sec)
			out = append(out, Claim{
				Object: ref, Cluster: clusterName(sec, sec.Name),
				Labels:  clusterLabels(SecretsSource, sec),
				Version: string(sec.UID) + "/" + sec.ResourceVersion,
				Config: func(context.Context) (*rest.Config, error) {
					if len(data) == 0 {
						return nil, fmt.Errorf("secret %s has no %q key", ref, SecretKubeconfigKey)
					}
					cfg, err := connection.KubeconfigConfig(data)
					if err != nil {
						return nil, fmt.Errorf("secret %s key %q: %w", ref, SecretKubeconfigKey, err)
					}
					return cfg, nil
				},
			})
		}
		return out
	})
}

// labelledSecrets is an informer over the Secrets of one namespace that
// match a label selector.
func labelledSecrets(c *clients, namespace, selector string) cache.SharedIndexInformer {
	f := informers.NewSharedInformerFactoryWithOptions(c.kube, relistEvery,
		informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	return f.Core().V1().Secrets().Informer()
}
