from cublas_audit.cli import main

main()
