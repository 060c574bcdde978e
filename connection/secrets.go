package connection

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Secret keys and labels of cluster Secrets.
const (
	// SecretKubeconfigKey is the data key holding the cluster's kubeconfig.
	SecretKubeconfigKey = "kubeconfig"
	// SecretClusterNameLabel, if set, names the cluster; otherwise the
	// Secret's name does.
	SecretClusterNameLabel = "fleetgraph.io/cluster-name"
)

// SecretSource adds, updates and removes clusters as labelled Secrets of
// the cluster fleetgraph runs in come and go. Each Secret holds a
// kubeconfig under SecretKubeconfigKey; its current context is used. A
// changed kubeconfig reconnects the cluster with it; a deleted Secret
// removes the cluster and its rows.
type SecretSource struct {
	Client    kubernetes.Interface
	Namespace string
	// Selector is a label selector for cluster Secrets, for example
	// "fleetgraph.io/cluster=true".
	Selector string
	Manager  *Manager

	mu    sync.Mutex
	data  map[string][]byte // cluster -> kubeconfig
	names map[string]string // secret name -> cluster
}

// Run watches the Secrets until ctx ends.
//
// Concurrency: Run starts one informer; its handlers run on the
// informer's goroutine and call the Manager, which is safe for concurrent
// use. Run returns after the informer has stopped.
func (s *SecretSource) Run(ctx context.Context) error {
	s.data, s.names = map[string][]byte{}, map[string]string{}
	factory := informers.NewSharedInformerFactoryWithOptions(s.Client, 0,
		informers.WithNamespace(s.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = s.Selector }))
	inf := factory.Core().V1().Secrets().Informer()
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    s.apply,
		UpdateFunc: func(_, obj any) { s.apply(obj) },
		DeleteFunc: func(obj any) { s.remove(ctx, obj) },
	})
	if err != nil {
		return fmt.Errorf("watch cluster secrets: %w", err)
	}
	factory.Start(ctx.Done())
	<-ctx.Done()
	factory.Shutdown()
	return nil
}

func clusterName(sec *corev1.Secret) string {
	if n := sec.Labels[SecretClusterNameLabel]; n != "" {
		return n
	}
	return sec.Name
}

func (s *SecretSource) apply(obj any) {
	sec, ok := obj.(*corev1.Secret)
	if !ok {
		return
	}
	name := clusterName(sec)
	kubeconfig := sec.Data[SecretKubeconfigKey]
	log := s.Manager.opts.Logger.With("cluster", name, "secret", sec.Namespace+"/"+sec.Name)

	s.mu.Lock()
	old, known := s.data[name]
	s.data[name] = kubeconfig
	s.names[sec.Name] = name
	s.mu.Unlock()

	switch {
	case !known:
		labels := maps.Clone(sec.Labels)
		delete(labels, SecretClusterNameLabel)
		spec := specFromKubeconfig(name, labels, func() []byte {
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.data[name]
		})
		if err := s.Manager.Add(spec); err != nil {
			log.Error("adding cluster from secret failed", "err", err)
			return
		}
		log.Info("cluster added from secret")
	case !bytes.Equal(old, kubeconfig):
		log.Info("cluster kubeconfig changed; reconnecting")
		if err := s.Manager.Reconnect(name); err != nil {
			log.Error("reconnect failed", "err", err)
		}
	}
}

func (s *SecretSource) remove(ctx context.Context, obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	sec, ok := obj.(*corev1.Secret)
	if !ok {
		return
	}
	s.mu.Lock()
	name, known := s.names[sec.Name]
	delete(s.names, sec.Name)
	delete(s.data, name)
	s.mu.Unlock()
	if !known {
		return
	}
	if err := s.Manager.Remove(ctx, name); err != nil {
		s.Manager.opts.Logger.Error("removing cluster failed", "cluster", name, "err", err)
		return
	}
	s.Manager.opts.Logger.Info("cluster removed with its secret", "cluster", name)
}
