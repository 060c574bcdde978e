package main

import (
	"log/slog"
	"strings"

	"github.com/spf13/pflag"

	"github.com/fleetgraph/fleetgraph/connection/sources"
)

// scopeFlags say what fleetgraph reads: the kinds it collects, the sources
// its clusters come from, and whether it fetches live object details. serve
// and rbac share them, so `fleetgraph rbac` with serve's flags prints the
// RBAC that serve needs.
type scopeFlags struct {
	kinds, extraKinds []string
	noDetails         bool
	sourceNames       []string
	sourceNamespace   string
	argoNamespace     string
	providerFile      string
	secretNamespace   string
	secretSelector    string
}

func (f *scopeFlags) register(fl *pflag.FlagSet) {
	fl.StringSliceVar(&f.kinds, "kinds", nil, "collect only these kinds, e.g. Pod,Kustomization.kustomize.toolkit.fluxcd.io (RBAC kinds are always collected)")
	fl.StringSliceVar(&f.extraKinds, "extra-kinds", nil, "collect more kinds, as group/version/Kind, e.g. apps/v1/Deployment")
	fl.BoolVar(&f.noDetails, "disable-object-details", false, "turn off live object details (Query.object), so fleetgraph need not impersonate viewers in the leaves")
	fl.StringSliceVar(&f.sourceNames, "source", nil, "where clusters come from: "+strings.Join(append([]string{sources.KubeconfigSource}, sources.Names...), ", ")+
		" (default kubeconfig, plus secrets with --cluster-secrets-namespace)")
	fl.StringVar(&f.sourceNamespace, "source-namespace", "", "read GitopsClusters, Cluster API Clusters and ClusterProfiles in this namespace only (default all)")
	fl.StringVar(&f.argoNamespace, "argocd-namespace", sources.DefaultArgoCDNamespace, "namespace of Argo CD's cluster Secrets")
	fl.StringVar(&f.providerFile, "clusterprofile-provider-file", "", "access-provider file of the clusterprofile source (the cluster inventory API's exec plugins)")
	fl.StringVar(&f.secretNamespace, "cluster-secrets-namespace", "", "namespace of the labelled cluster Secrets of the secrets source")
	fl.StringVar(&f.secretSelector, "cluster-secrets-selector", sources.DefaultSecretsSelector, "label selector of cluster Secrets")
}

// sourceOptions are the sources' options but for the management cluster.
func (f *scopeFlags) sourceOptions() sources.Options {
	return sources.Options{
		Namespace: f.sourceNamespace, ArgoCDNamespace: f.argoNamespace,
		SecretsNamespace: f.secretNamespace, SecretsSelector: f.secretSelector,
		ProviderFile: f.providerFile, Logger: slog.Default(),
	}
}
