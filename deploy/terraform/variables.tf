variable "project_id" {
  description = "Google Cloud project that holds the bucket, the service accounts and the GKE cluster (its Workload Identity pool is PROJECT_ID.svc.id.goog)."
  type        = string
}

variable "region" {
  description = "Region of the bucket: the region of the GKE cluster whose jobs use the cache, so reads stay in-region and free of egress charges."
  type        = string
  default     = "us-central1"
}

variable "bucket_name" {
  description = "Bucket name; null means PROJECT_ID-jax-cache (the name the Kubernetes manifests use)."
  type        = string
  default     = null
}

variable "cache_prefix" {
  description = "Object prefix of the cache root inside the bucket: the cache URL is gs://BUCKET/PREFIX."
  type        = string
  default     = "jax-cache"
}

variable "backstop_delete_age_days" {
  description = "If set, GCS deletes every object this many days after its creation, hit or not: a backstop behind the service's prune, for when the prune stops running. null (the default) leaves deletion to the prune."
  type        = number
  default     = null

  validation {
    condition     = var.backstop_delete_age_days == null ? true : var.backstop_delete_age_days >= 1
    error_message = "backstop_delete_age_days must be null (off) or at least 1."
  }
}

variable "service_namespace" {
  description = "Kubernetes namespace of the jaxcache service (deploy/k8s/base)."
  type        = string
  default     = "jaxcache"
}

variable "service_ksa" {
  description = "Kubernetes service account of the jaxcache service."
  type        = string
  default     = "jaxcache"
}

variable "training_namespaces" {
  description = "Namespaces whose training jobs read and write the cache, each with the service account training_ksa."
  type        = list(string)
  default     = ["ml-training"]
}

variable "training_ksa" {
  description = "Kubernetes service account of training jobs (deploy/k8s/examples/training-job.yaml)."
  type        = string
  default     = "jaxcache-training"
}

variable "warmup_namespaces" {
  description = "Namespaces where warm-up Jobs run, each with the service account warmup_ksa."
  type        = list(string)
  default     = ["ml-training"]
}

variable "warmup_ksa" {
  description = "Kubernetes service account of warm-up Jobs (deploy/k8s/warmup-job.yaml)."
  type        = string
  default     = "jaxcache-warmup"
}
