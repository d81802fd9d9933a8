output "cache_url" {
  description = "The cache root: JAXCACHE_CACHES of the service, JAXCACHE_DIR of jobs, --cache-dir of warm-up."
  value       = "gs://${google_storage_bucket.cache.name}/${var.cache_prefix}"
}

output "bucket" {
  description = "Bucket name (bucketName of a GCSFuse volume)."
  value       = google_storage_bucket.cache.name
}

output "service_account_annotations" {
  description = "iam.gke.io/gcp-service-account value for each Kubernetes service account."
  value = {
    service  = google_service_account.service.email
    training = google_service_account.training.email
    warmup   = google_service_account.warmup.email
  }
}
